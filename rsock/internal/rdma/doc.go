// Package rdma is rsock's RDMA stream engine: a byte stream over one reliable-connected
// queue pair, with the bytes written by RDMA_WRITE_WITH_IMM straight into the peer's
// pre-posted receive ring and paced by package flowctl's credits.
//
// The engine knows nothing of which verbs provider it runs on, nor of the hello that
// negotiated it: rsock's upgrade step calls [Prepare] on each side to create a QP and
// register a ring, exchanges the two [Offer]s over the bootstrap connection, and calls
// [Endpoint.Connect] to bring the QP to RTS and obtain a [Conn]. The first message on
// each QP is then the caller's proof ([Conn.SendProof], [Conn.ProofDone], [Conn.Proof];
// conn_proof.go), which lands in a receive WQE posted ahead of the flow-controlled ones
// and outside flow control; the caller may take the peer's ring from it
// ([Conn.SetPeerRing]) and calls [Conn.Start] once the path is proven.
//
// Devices are shared: one opened context, protection domain and set of CQs per
// provider and device, whatever the number of connections. The port and the source GID
// belong to each connection: [PrepareContext] picks them by the bootstrap connection's
// local IP and names the GID by its hardware index in the port's table, which may have
// holes. Finding and opening the device is bounded by the caller's context, and a burst
// of connections on a cold cache lists the provider's devices once.
//
// Files follow the data path: setup.go (resources and QP transitions), conn_proof.go
// (the proof exchange before Start), conn_send.go
// (Write), conn_recv.go (Read and spilling), conn_spill.go (the unpinned receive
// buffer), conn_flow.go (credits and completions), conn_close.go (FIN and teardown),
// poller.go (completion polling shared by many connections), device.go (per-device
// shared context, PD and CQs).
//
// # Buffering
//
// Programs written for TCP count on the kernel buffering a few megabytes per
// connection: they write a whole request before the peer has accepted, write a large
// response before reading, write their last bytes and close. The registered ring is the
// NIC's landing zone and is pinned, so it stays small (128 KiB by default); alone, it
// would block such a writer after 128 KiB, and deadlock some of them.
//
// So a Conn also buffers in ordinary, unpinned memory, on the receiving side: when its
// application is not reading, the engine copies arrived bytes out of the ring into a
// spill buffer that grows in 64 KiB chunks up to Options.ReadBufferSize (4 MiB by
// default, Linux's default ceiling for a TCP send buffer; TCP on loopback absorbs about
// that much), and tells flowctl they are consumed, which returns their ring credit to
// the writer. Read takes the spilled bytes first, then the ring's. Which bytes and when
// is flowctl's rule ([flowctl.Endpoint.Spillable]): everything buffered, once half the
// ring is, checked after every arrival and at the end of every Read; a writer toward an
// application that does not read gets rid of at least ReadBufferSize plus half a ring
// before Write blocks, whether or not the peer has called Accept (the engine receives
// from the moment the upgrade completes).
//
// Why the receiver, and not a queue of unsent bytes at the sender:
//
//   - Nothing changes on the wire or in the credit protocol. To flowctl a spill is a
//     read, and its model tests cover readers that read any amount at any time; they
//     also check the spill rule itself against readers that never read or stop.
//   - Write keeps its meaning: when it returns, the bytes are posted, and on RC they
//     reach the peer unless the connection fails. Close has nothing of its own to
//     deliver, only a FIN to see acknowledged (see Closing), so it needs no background
//     goroutine and cannot lose bytes it had promised.
//   - An application that reads keeps the fast path: nothing spills while a Read is in
//     progress, and a reader that keeps up never lets the ring get half full, so bytes
//     are copied once, from the ring to the caller, as before.
//
// The cost is a second copy for bytes that arrive while nobody reads, made on the
// poller's goroutine (or the ending Read's) with the Conn's mutex held, and memory at
// the receiver that a slow reader holds, as TCP's receive buffer does. Chunks come from
// a process-wide pool and go back to it as they are read, so a connection that spills
// now and then allocates nothing in steady state, and an idle one holds no chunk.
//
// # Closing
//
// Close posts the FIN behind every byte Write accepted and waits for it to complete:
// a completion on RC means the peer's device has the bytes, in its ring, and the peer's
// engine spills them if its application is not reading, so this takes one round trip
// whatever the peer's application does. Only a peer whose device does not answer makes
// Close wait up to Options.Linger (5 s by default; negative: no wait); then it tears the
// connection down regardless. The peer reads io.EOF only after the FIN, which follows
// all the data on the QP; a peer that sees the control connection end without the FIN
// reads the bytes that arrived and then an error matching ErrControlLost, never a
// clean io.EOF after a truncated stream. CloseWrite posts the FIN and returns.
package rdma
