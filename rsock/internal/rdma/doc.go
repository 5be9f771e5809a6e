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
// Devices are shared: one opened context and set of CQs per provider and device,
// whatever the number of connections; the protection domain is each connection's own
// (see Isolation). The port and the source GID
// belong to each connection: [PrepareContext] picks them by the bootstrap connection's
// local IP with the one selector, verbs.Selector (RoCE GID equal to the IP, v2 unless
// Options.RoCEVersion says v1; on InfiniBand the port whose IPoIB interface holds it;
// iWARP refused), and names the GID by its hardware index in the port's table, which
// may have holes. Finding and opening the device is bounded by the caller's context,
// and a burst of connections on a cold cache lists the provider's devices once. A
// device whose last connection has closed stays warm (open, one CQ, no goroutine) for
// a while, so that the next connection skips opening it and creating a CQ (warm.go;
// [CloseIdle] closes it at once).
//
// A connection's queue depths and buffers are checked against the device's limits
// before it allocates anything (caps.go): beyond max_qp_wr, max_cqe or max_mr_size,
// [PrepareContext] fails with [ErrDeviceLimit] naming each figure, and rsock falls
// back; the CQ size and the inline size are fitted to the device instead.
//
// Files follow the data path: setup.go (resources and QP transitions), conn_proof.go
// (the proof exchange before Start), conn_send.go
// (Write), conn_recv.go (Read and spilling), conn_spill.go (the unpinned receive
// buffer), conn_flow.go (credits and completions), conn_close.go (FIN and teardown),
// poller.go (completion polling shared by many connections, one CQ per poller, spread
// over the device's completion vectors), device.go (per-device shared context and
// CQs), warm.go (devices kept open between connections), pool.go (endpoints' PDs and first regions reused by the next), events.go (the device's asynchronous events: a fatal device or a port going
// down fails its connections at once, port changes refresh the device listing),
// conn_alive.go (liveness: the keepalive probe and the silence bound), caps.go (device
// limits), budget.go (registered-memory budget and RLIMIT_MEMLOCK), conn_resize.go
// (rings that grow and shrink), zcopy.go (large Writes posted from the caller's buffer),
// place.go (large Reads' buffers written by the peer's device).
//
// Work request IDs carry the endpoint's generation (conn_flow.go), so a destroyed QP's
// completions, which some devices leave in the shared CQ, never reach the connection
// whose QP reuses its number.
//
// A Read or Write that has to wait polls the shared CQ itself for a bounded spin before
// it parks (conn_poll.go; at most GOMAXPROCS waiters spin on a CQ at once): the
// completion it waits for then reaches it without a hand-off from the poller's
// goroutine, which stands by meanwhile, and completions signal a waiter only when it
// is parked. The last spinner to leave hands the CQ back to the goroutine only when
// someone needs it (nudge.go): a waiter parks, or nobody has spun again for
// nudgeGrace (100 ms; paid within twice that). The client's wait for the peer's proof
// polls the same way ([Conn.SpinProof]). The goroutines that come and go with
// connections (a poller's, a device's event listener) wait on a stopCtx (stopctx.go),
// which costs a connection that restarts them one allocation each rather than
// context.WithCancel's three.
//
// # Isolation
//
// A connection's ring can be written only by its own peer's QP. Each [Endpoint]
// allocates a protection domain of its own and creates its QP and registers its ring
// and send buffer in it (Endpoint.registerCounted; nothing registers in any other
// PD). The device checks, on every request, that the rkey names a region of the
// responder QP's PD: a peer that learns or guesses another connection's ring address
// and rkey and writes there gets a remote access error, its own connection's QP goes to ERROR (that
// connection fails with ErrQPFailed), and the other connection sees nothing.
// TestFaultCrossConnectionWrite shows it on soft and on a kernel device, and the verbs
// conformance rule RemoteAccessOtherConnection holds every provider to it.
//
// Why a PD per connection and not type-2 memory windows over shared regions: a PD costs
// one small kernel object per connection and nothing on the data path, and works on
// every device. A type-2 window is bound by a work request on its QP, so only once the
// QP is in RTS: the bind would have to complete before the proof that carries the
// ring's rkey (conn_proof.go), every ring resize would be another bind through the
// send queue and its credits, and not every device (nor soft) supports type-2 windows.
// Windows pay off when
// many connections share one registration (pooled pinned memory). With a PD per
// connection, pooling stays per connection: a ring grows and shrinks by registering
// regions in the connection's PD, and the pages behind them may come from a
// process-wide pool of unpinned memory; one registration is never shared at once.
// Short connections in a row reuse whole PDs instead: a released endpoint's PD, first
// ring and staging buffer wait, registered, in a small pool on the device for the next
// endpoint of the same sizes (pool.go), which never shares them with another. If
// registration cost ever dominates beyond that (many concurrent short connections),
// windows bound to each QP over a per-process region are the way on, behind the same
// seam (registerCounted and Budget).
//
// Options.Budget bounds what an endpoint may hold: it is charged for the QP and for
// every registered byte before they are allocated, and refunded as they are released.
// rsock's Listener charges the endpoints of its unauthenticated clients to per-listener
// and per-remote-address limits.
//
// # Buffering
//
// Programs written for TCP count on the kernel buffering a few megabytes per
// connection: they write a whole request before the peer has accepted, write a large
// response before reading, write their last bytes and close. The registered ring is the
// NIC's landing zone and is pinned, so it stays small (8 KiB by default, growing to
// 4 MiB under a stream: "Rings that grow"); alone, it would block such a writer once
// it is full, and deadlock some of them.
//
// So a Conn also buffers in ordinary, unpinned memory, on the receiving side: when its
// application is not reading, the engine copies arrived bytes out of the ring into a
// spill buffer that grows in 64 KiB chunks up to Options.ReadBufferSize (4 MiB by
// default, Linux's default ceiling for a TCP send buffer; TCP on loopback absorbs about
// that much), and tells flowctl they are consumed, which returns their ring credit to
// the writer. Read takes the spilled bytes first, then the ring's. Which bytes and when
// is flowctl's rule ([flowctl.Endpoint.Spillable]): everything buffered, once half the
// ring is and the writer has no ring credit left, checked after every arrival and at
// the end of every Read; a writer toward an application that does not read gets rid of
// at least ReadBufferSize plus half a ring before Write blocks, whether or not the peer
// has called Accept (the engine receives from the moment the upgrade completes).
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
//     progress, and between two Reads only when its writer has run out of ring
//     credit, which a reader that keeps up seldom lets happen: the other bytes are
//     copied once, from the ring to the caller.
//
// The cost is a second copy for bytes that arrive while nobody reads, made on the
// poller's goroutine (or the ending Read's) with the Conn's mutex held, and memory at
// the receiver that a slow reader holds, as TCP's receive buffer does. Chunks come from
// a process-wide pool and go back to it as they are read, so a connection that spills
// now and then allocates nothing in steady state, and an idle one holds no chunk.
//
// # Rings that grow
//
// A ring sized for a busy stream is wasted on an idle connection, and most connections
// of a fleet are idle: with a fixed 128 KiB ring and 64 KiB of staging an idle end holds
// about 235 KiB, 192 KiB of it registered, which is pinned on a real device. So by
// default a connection starts small and grows with use instead (Options.GrowRingTo,
// DefaultGrowRingTo; a negative one keeps a fixed ring of RingSize):
//
//   - The ring starts at RingSize and grows four-fold (to GrowRingTo at most) after a
//     data arrival that finds three quarters of it held by the peer (buffered, or
//     consumed and not yet credited back), or once four rings' worth of data has passed
//     through it: the stream is busy, and a larger ring keeps more of it in flight.
//     Past 512 KiB only the first counts (a ring costs its size in cache, since the
//     writer sweeps all of it, and gains only a writer that would wait). It
//     shrinks back to RingSize at the second keepalive tick with nothing arrived and
//     nothing buffered.
//   - A resize is flowctl's: the engine registers the new ring, flowctl hands out a
//     resize message, which the engine writes, with the new ring's address and key
//     (conn_resize.go), into a 64-byte mailbox behind the peer's ring; the peer's
//     flowctl answers with a switch, after which its writes go to the new ring from its
//     start. The old ring stays until its bytes are read (or spilled), then is
//     deregistered. No byte moves, so none is lost or reordered; see flowctl's
//     "Resizing the ring" for why the credit rules keep holding.
//   - The staging buffer starts at half the first ring and grows four-fold, up to
//     SendBufferSize (by default 256 KiB, and 1 MiB on a provider that pins, where
//     every Write under 1 MiB is staged: Endpoint.stageMax), when it rather than credit
//     limits a write; the old one stays until the sends from it complete. It shrinks
//     back to its first size at the second keepalive tick with nothing staged, once
//     every send from it has completed (idleShrinkStageLocked).
//
// At the defaults (RingSize 8 KiB, GrowRingTo 4 MiB) an idle end holds about 58 KiB
// in all (TestIdleFootprint: 5,000 connections, heap with soft's registered memory, its
// share of the CQs, goroutine stacks), 12 KiB of it registered, and a stream whose
// writer outruns its reader grows to a 4 MiB ring and 256 KiB of staging (1 MiB on
// rdma-core).
//
// Rings above 512 KiB return credit in units of more than a byte, and flowctl resizes a
// ring only within its unit. So every ring of a connection has the unit of the largest
// it may grow to (8 bytes for 4 MiB), which its offer names (Offer.UnitRingSize, a byte
// the hello appends to its endpoint), and the peer takes it from there. A peer whose
// hello lacks that byte predates it and would take each ring's unit from its size:
// toward it, neither side fixes a unit, and rings grow to 512 KiB at most, the largest
// that shares the 1-byte unit (Connect). Every ring, fixed or not, is
// followed by its mailbox, since any peer may grow: the hello's version rules out peers
// from before rings grew, so no capability bit is needed.
//
// # Receive queues that grow
//
// Every message takes one of the receiver's posted receive WQEs, whatever its length,
// so a one-way stream of messages small against the ring runs out of WQE credit first:
// with 64 WQEs, a stream of 4 KiB writes has at most 256 KiB in flight, however large
// the ring has grown. On Soft-RoCE, 128 or 256 WQEs streamed 4 KiB writes 16-26%
// faster than 64 (benchmarks/README.md, "Deeper queues on Soft-RoCE"). But each WQE
// reserves an entry of the shared CQ for its completion, so that a CQ of 16,384
// entries holds 127 connections at 64 and 84 at 128, idle or not.
//
// So by default a connection starts with RecvWQEs (64) and doubles them, up to
// GrowRecvWQEsTo (128), when a stream needs them (conn_wqes.go): after four data
// arrivals, each of which finds a standalone credit update due by WQE count (half the
// WQEs owed to the peer) while less than half the ring is held. Only one-way streams
// make an update due by count: traffic the other way carries the credit back as it
// goes. And only messages small against the ring make it due before the ring's half is
// held. The new WQEs are posted, their CQ entries reserved on the poller (a CQ without
// room stops growth, and the connection goes on with what it has), and flowctl is told
// ([flowctl.Endpoint.GrowWQEs]); their credit goes to the peer in the next message,
// with no message of its own (flowctl's "Growing the receive queue"). The QP is
// created with room for GrowRecvWQEsTo, fitted to the device's max_qp_wr: a receive
// queue's depth is fixed when the QP is created, and the room costs a few kilobytes of
// queue memory, not CQ entries. A posted WQE cannot be taken back, so the queue does
// not shrink when the connection idles.
//
// The peer must take credit beyond the messages it sent as WQEs added, which a peer
// from before this growth would reject as a protocol violation. So the offer names the
// most WQEs its side may grow to (Offer.GrowRecvWQEsTo, four bytes the hello appends),
// and a side grows only toward a peer whose hello carries them. A RecvWQEs the
// application chose is kept as chosen: the queue grows only from the default.
//
// # Direct writes
//
// A Write of 32 KiB or more, on a provider whose protection domain registers memory the
// caller owns (verbs.MemoryRegistrar: soft and ibv; verbs.LocalMemoryRegistrar, for its
// own sends only: shm), skips the staging copy: it registers the application's buffer
// through a small per-connection cache and posts from it, and returns once the device
// has completed those sends, so the buffer may be reused at once (zcopy.go). The wire
// is unchanged, so no capability bit is needed. On a provider that pins (rdma-core),
// those registrations pin the application's pages, so they are counted like the
// engine's own regions (below) and bounded (4 MiB a buffer, four buffers a connection,
// let go when idle); a Write whose registration is refused is staged, never failed.
// There, direct Writes start at 1 MiB: waiting for the device's completions costs each
// Write a round trip, which smaller ones do not earn back (directpin.go); on shm the
// round trip is the peer process's, short enough for 32 KiB (zcopy.go). On soft and
// shm they are the application's memory, neither pinned nor counted.
//
// # Direct placement
//
// A Read of 128 KiB or more that finds nothing buffered advertises its buffer to the
// peer (flowctl's "Direct placement"), and a Write that finds the advertisement usable
// writes into it, from its own buffer when direct, else from staging: the Read returns
// the bytes without copying them out of the ring. Both sides must say so in the hello
// (capPlace) and allow it (Options.NoPlacement), and only endpoints whose PD registers
// the caller's memory without pinning it do (soft): shm's PD registers the caller's
// memory for its own sends only, which a peer process cannot reach, and on rdma-core a
// registration per Read cost more than the copy it saves and a cached one would leave
// the buffer writable after Read returns (place.go). The buffer's registration is kept
// in a small cache. A Read that must return while its advertisement may still be used
// (deadline, Close) cancels it and waits for the answer or for the QP to leave service.
// A large Write waits briefly for the advertisement of a peer whose Reads wait
// (place.go's awaitAdvert); without it, the next Write would usually start just before
// the advertisement arrives and go to the ring.
//
// # Registered memory limits
//
// Every region the engine registers goes through one function (registerMR), which
// counts it against Options.MaxRegisteredMemory, a budget per device of the process,
// and, on a provider that pins (rdma-core) and without CAP_IPC_LOCK, against
// RLIMIT_MEMLOCK, whose default for an unprivileged user is often 64 KiB to 8 MiB. A
// connection that would pass either fails to prepare with ErrMemoryBudget or ErrMemlock
// naming the limit and the figures, and rsock falls back to TCP; the kernel's own ENOMEM
// from a registration (memory pinned elsewhere in the process) is reported as
// ErrMemlock with the fix. A ring or staging buffer that cannot grow for the same
// reasons stays as it is. A ring grows past 512 KiB, under a binding RLIMIT_MEMLOCK,
// only while rsock pins at most half the limit (growthFits): a few streams' rings would
// otherwise pin all of it, and every connection after them fall back.
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
