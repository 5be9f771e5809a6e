// Package rsock provides a [net.Conn] and a [net.Listener] whose bytes move over RDMA
// reliable-connected queue pairs when both ends have an RDMA device, and over TCP or
// QUIC when they do not. Programs written against net.Conn (net/http, grpc-go, ...) run
// unmodified.
//
// # Usage
//
// A server swaps net.Listen for [Listen]; a client swaps its dialer for a [Dialer]:
//
//	ln, err := rsock.Listen("tcp", ":7000", cfg) // *rsock.Listener, a net.Listener
//	go http.Serve(ln, handler)
//
//	d := &rsock.Dialer{Config: cfg}          // d.DialContext fits http.Transport.DialContext
//	c, err := d.DialContext(ctx, "tcp", "host:7000")
//
// cfg is a [*Config], nil for the defaults. Network names are net's: "tcp", "tcp4" and
// "tcp6". Every connection reports what carries it and why that is not RDMA:
//
//	rc := c.(*rsock.Conn)
//	rc.Transport()      // "rdma", "rdma+tls", "tcp" or "quic"
//	rc.FallbackReason() // nil on RDMA; else e.g. "rsock: upgrade to rdma: peer declined: no RDMA device"
//
// # Connection life cycle
//
// Every connection starts on its fallback transport, [FallbackTCP] by default or
// [FallbackQUIC], to the address given. The first message in each direction is the
// hello: the client offers RDMA (its device, queue pair and receive ring) or says it
// offers none; the server answers with its own offer or declines, giving a reason. On
// an upgrade, the two sides prove the path over the new queue pairs (below) and the
// client confirms; the bytes then move over RDMA and the bootstrap connection stays
// open as the control channel. Otherwise the bootstrap connection carries the bytes.
//
// A client that offers no RDMA sends its hello and returns from Dial at once, and may
// write right away: a fallback connection costs no round trip over plain TCP. The
// server's answer is consumed by the client's first Read. If the peer is not an rsock
// server, that Read fails with an error matching [ErrNotRsockPeer].
//
// On TCP, a Conn's Read and Write call the [net.TCPConn] directly, and io.Copy to or
// from a Conn keeps the kernel's splice and sendfile paths.
//
// # Buffering and closing
//
// A Conn buffers like a TCP socket, whatever carries it. Over RDMA, the peer writes
// into a small registered ring ([Config.RingSize]), and when the application is not
// reading, the engine moves arrived bytes out of the ring into ordinary memory, up to
// [Config.ReadBufferSize] (4 MiB by default), so that the peer's writes go on: a client
// may write a whole request before the server has accepted or read, and both sides may
// write a large message before reading the other's, as over TCP. A writer whose peer
// does not read gets rid of at least ReadBufferSize plus half the ring before Write
// blocks, about what TCP absorbs on loopback with Linux's defaults. Only bytes that
// wait for a reader are copied twice; a reader that keeps up reads them straight out of
// the ring. Registered (pinned) memory stays the ring and the send staging buffer, and
// both start small and grow only under a stream ([Config.GrowRingTo]): an idle
// connection end registers 12 KiB and holds about 58 KiB in all at the defaults.
//
// Close returns without waiting for the peer's application: the bytes Write accepted
// and the end of stream after them are already in the peer's buffers once the peer's
// device acknowledges them, one round trip. A peer that reads them later reads them
// all and then io.EOF. Only when the peer's machine stops answering does Close wait,
// at most [Config.Linger] (5 s by default), before tearing the connection down; the peer
// then reads what arrived followed by an error, never a clean io.EOF after a truncated
// stream. CloseWrite sends the end of stream and returns at once.
//
// # Fallback reasons and errors
//
// [Conn.FallbackReason] returns a [*FallbackError] that matches, with [errors.Is], one
// of [ErrNoProvider], [ErrNoDevice], [ErrPeerOfferedNone], [ErrVersionMismatch],
// [ErrResourcesExhausted], [ErrMTUMismatch], [ErrNoRoute], [ErrRDMAUnavailable],
// [ErrPathUnproven], [ErrUpgradeFailed] or [ErrPlainClient], and also [ErrPeerDeclined] when the reason is
// the peer's. These are not errors of the connection, which works. A handshake that
// fails (garbage, a truncated or oversized hello, an answer of an unknown version, a
// peer that does not speak rsock) fails the connection with an error matching
// [ErrBadHello], [ErrVersionMismatch] or [ErrNotRsockPeer]. Listen and Dial refuse a
// [Config] field out of its range with an error matching [ErrInvalidConfig] that names
// the field and the range; a dial whose context ends fails with an error matching the
// context's (context.Canceled or context.DeadlineExceeded), whatever step it was in.
//
// # Failures
//
// An RDMA connection that fails returns, from Read (after the bytes that arrived) and
// Write, an error matching one of [ErrQPFailed], [ErrCQFailed], [ErrControlLost],
// [ErrKeepaliveTimeout], [ErrPeerClosed], [ErrProtocol], [ErrDeviceFatal] or
// [ErrPortDown]; rsock/FAILURE_MODES.md lists when. The RDMA device's asynchronous
// events fail connections at once: a fatal device every connection on it
// ([ErrDeviceFatal]), a port that goes down (link or netdev down) every connection on
// that port ([ErrPortDown]); port changes (GIDs, LID, a port back up) are seen by the
// next connection. A peer that falls silent, from the very start of the connection,
// is detected by a probe sent every [Config.KeepAlive] period (15 s by default): a dead
// path within one period and the queue pair's retry budget (about half a second), and
// a peer whose device answers nothing at all within four periods of its last sign of
// life ([ErrKeepaliveTimeout]).
//
// # Observability
//
// [Conn.Stats] reports a connection's transport, fallback reason and bytes and, on
// RDMA, its messages, credit stalls, failed completions and buffer occupancy; it
// allocates nothing. [Config.Tracer] receives each connection's events ([ConnTracer]).
// Process-wide counters (connections by transport, fallbacks by reason, handshake
// failures by cause, bytes by transport) are published with expvar as the variable
// "rsock": importing this package registers it, and, as with any expvar variable,
// expvar's /debug/vars handler on [net/http.DefaultServeMux]; metrics.go lists the
// keys.
//
// # Listening
//
// A [Listener] runs the handshakes of new connections concurrently: a slow client, or
// one that sends garbage, costs only its own connection, which is closed when its
// handshake fails or outlasts [Config.HandshakeTimeout] and is reported to
// [Config.Logger]. Accept is never blocked by it. With [FallbackQUIC], a Listener
// serves QUIC on UDP and TCP on the same port number; [Listener.Addr] is the TCP one.
//
// With [Config.AcceptPlainClients], a Listener also serves clients that speak no
// rsock: it tells them apart by their first bytes and hands them through untouched.
// A plain client that waits for the server to speak first is recognized only after
// [Config.PlainSniffTimeout] (200 ms by default) without a byte from it, and so hears
// from the server that much later. An rsock client sends the hello's first bytes
// before it finds and prepares its RDMA device, so a slow device does not make it
// look plain.
//
// What a Listener's clients can hold before they have proven anything is bounded: the
// handshakes in progress ([Config.MaxConcurrentHandshakes]), and over RDMA the
// connections (each a queue pair) and the registered memory, per remote address (an
// IPv6 client's /64) and per listener ([Config.MaxRDMAConnsPerRemote] and its
// siblings). A connection past a limit falls back to its bootstrap transport with a
// reason matching [ErrResourcesExhausted] that names the limit and its figure, on both
// sides. A Listener also keeps one RDMA endpoint prepared for its next client, made as
// one of its RDMA connections closes and released after a second unused, when the
// Listener closes, or by [CloseIdleDevices]: it is charged to the client that takes
// it, and counts against the process's registered memory
// ([Config.MaxRegisteredMemory], RLIMIT_MEMLOCK) meanwhile. Each RDMA connection has
// a protection domain of its own, so a peer can write only into its own connection's
// ring: a write aimed at another connection's ring, with its rkey, fails with a remote
// access error and ends the writer's connection.
//
// Connections map memory (rings, staging buffers, queues; about ten mappings per
// same-host connection with both ends in one process), and Linux refuses a process
// more than vm.max_map_count mappings (65,530 by default), past which the Go runtime's
// own next mmap fails and the process dies. rsock's providers therefore take at most
// half of vm.max_map_count; a connection past that falls back to TCP with a reason
// matching [ErrResourcesExhausted] that names vm.max_map_count. Raise the sysctl for a
// process that holds many thousands of connections on shared memory or RDMA; rsock
// reads it again before it refuses one, so the process need not restart.
//
// A Listener logs through [Config.Logger]; without one, WARN and above go to
// [log/slog.Default], so that a server refusing clients that speak no rsock (curl, a
// stock http.Client, without [Config.AcceptPlainClients]) says so and how to serve them.
//
// The environment variable RSOCK_DISABLE_RDMA=1 ([EnvDisableRDMA]) turns RDMA off for
// every Listener and Dialer of the process, whatever their Config says: an operator's
// switch for a deployed binary. It is read once. RSOCK_DISABLE_SHM=1 ([EnvDisableSHM])
// turns shared memory between processes of one host off the same way.
//
// # Security
//
// What travels in plaintext depends on the bootstrap transport, and rsock keeps what the
// bootstrap promised:
//
//   - [FallbackTCP]: the hello, the control channel and, on a fallback, the data cross
//     the network in plaintext, and nothing is authenticated. After an upgrade the bytes
//     cross the RDMA fabric in plaintext too ([Conn.Transport] "rdma").
//   - [FallbackQUIC]: the hello and the control channel travel inside QUIC's TLS 1.3,
//     which authenticates the server by its certificate ([Config.TLSConfig]; the client
//     too if the server asks for client certificates). After an upgrade the RDMA stream
//     runs TLS 1.3 with the same TLSConfig ("rdma+tls"): the client verifies the server's
//     certificate and name exactly as its QUIC handshake did, and the fabric sees only
//     TLS records. Plaintext RDMA ("rdma") happens only when both sides set
//     [Config.AllowPlaintextRDMA]. The two sides agree on it with one byte each at the
//     start of the RDMA stream; a byte forged on the fabric can force TLS, never
//     plaintext on a side that requires TLS, and a byte that is neither fails the
//     connection.
//
// The hello carries this side's RDMA endpoint (device address, queue pair number,
// starting packet sequence number, ring size) and a fresh nonce, but no ring address or
// key; on QUIC nobody but the authenticated server and its client sees or alters it.
// Each connection has a protection domain of its own, so its ring is reachable only by
// its own peer's queue pair, and the RDMA peer is proven to be the bootstrap peer (see
// "Proving the path"): a hello captured on one bootstrap connection and replayed on
// another never yields an RDMA connection, and nobody on the bootstrap learns a ring's
// key, which travels only in the proof over the new queue pair. (A connection may reuse
// the ring, cleared, and protection domain of an earlier one on the same RDMA device, to
// save registering them; never over shared memory, where the peer maps the ring itself.
// The ring keeps its key, which that earlier peer knew, but that peer's queue pair is
// gone with its connection, and a write into the ring needs the new queue pair's number
// and packet sequence number, as for any other host.)
//
// An RDMA peer, once connected, can write into its connection's receive ring: that is
// how its bytes arrive. rsock parses what it writes as stream data and flow-control
// messages, and fails the connection with [ErrProtocol] when they break the protocol.
// The peer cannot read this side's memory (no remote read access is granted) and
// cannot write anywhere but the ring. On verbs/soft, whose peers are goroutines of this
// process, there is one exception, direct placement ([Config.NoDirectPlacement] turns
// it off): a Read of at least 128 KiB that finds nothing buffered lets the peer write
// the next bytes of the stream straight into its buffer, and that buffer stays
// registered for reuse. On rdma-core (verbs/ibv) and the same-host transport, rsock
// never offers it.
//
// RoCE itself authenticates nothing. A receiving queue pair accepts any packet that
// names it and carries the next expected packet sequence number: the source queue pair
// is not checked, and the invariant CRC is a checksum, not a MAC. A host on the same L2
// network (or one that can route RoCE v2's UDP packets to the device) that learns or
// guesses a connection's queue pair number and sequence numbers can read plaintext
// RDMA traffic and inject writes into it. Over "rdma+tls" such a write breaks a TLS
// record, so the connection fails with an error instead of delivering forged bytes;
// availability is not protected.
//
// To encrypt: bootstrap over QUIC (the RDMA stream then carries TLS by default), or run
// [crypto/tls] over any rsock Conn, on every transport, as over TCP:
//
//	c, err := d.DialContext(ctx, "tcp", addr)      // any transport
//	tc := tls.Client(c, &tls.Config{ServerName: "server"})
//	// server side: tls.Server(conn, cfg), or tls.NewListener(ln, cfg), or http.Server.ServeTLS(ln, "", "")
//
// # Limitations
//
//   - Over a TCP bootstrap nothing is authenticated: a machine on the path can alter
//     or strip the hello (forcing a fallback, or pointing a client at another RDMA
//     endpoint) and read or alter the data. Run TLS over the Conn where that matters.
//     A Listener with FallbackQUIC serves TCP clients too, and their connections are
//     plaintext, on RDMA or not: the client chose its bootstrap.
//   - Over "rdma+tls", deadlines behave as crypto/tls's: after a Write times out the
//     connection is unusable. TLS costs CPU on both ends: on verbs/soft, a 64 KiB
//     stream moves about a tenth of plaintext RDMA's bytes per second (still several
//     times QUIC's), and a 64-byte round trip takes two to three times as long (about
//     a tenth of QUIC's); see benchmarks/.
//   - A QUIC-bootstrapped upgrade needs both ends to speak the mode exchange above: a
//     peer that moves bytes straight after the upgrade fails the connection, rather
//     than being read as plaintext.
//   - rsock does not protect against a fabric peer that floods or breaks connections:
//     RDMA offers no way to tell its packets from the real peer's short of encryption,
//     which detects them but cannot stop them.
//   - A Listener's limits count queue pairs and registered memory, not completion-queue
//     entries. Each RDMA connection reserves 129 entries of a shared completion queue
//     at the defaults, and a peer that streams small messages one way makes its
//     connection's receive queue grow and reserve up to 193 ([Config.RecvWQEs]); a
//     queue holds 16,384, and the engine creates another when one is full. The
//     device's memory for them is bounded by MaxRDMAConnsPerRemote connections'
//     worth, not by a budget of its own.
//
// # Proving the path
//
// Queue pairs reach their ready-to-send state without a packet crossing the fabric, so
// a connected pair of QPs says nothing about the path: with RoCE's UDP port 4791
// filtered, traffic routed to another device, or the wrong GID, the QPs connect and the
// first RDMA write dies half a second later. So before either side moves an application
// byte to RDMA, each sends a proof over its new QP and the client confirms only once the
// server's proof has arrived over its own. A failed proof (its send runs out of
// transport retries, about half a second on a dead path), or one that does not arrive
// within half what is left of [Config.HandshakeTimeout] (5 s by default; a loaded
// machine may be slow, a working path is not cut short), ends the upgrade: both sides stay on the
// bootstrap transport with a reason matching [ErrPathUnproven] that names the likely
// cause ("no RDMA message from the peer ...: is RoCE (UDP 4791) blocked or routed
// elsewhere?"; on shared memory, the peer's process: out of open files, or in another
// network namespace or run by another user). Nothing the application wrote is lost: it
// had not left the bootstrap.
//
// The proof also binds the RDMA peer to the bootstrap peer. Each hello carries a fresh
// random nonce, and each proof echoes both, so a proof proves that the party sending it
// over the QP saw this connection's hellos. The server treats a connection as RDMA only
// after such a proof arrived over its QP and the client confirmed: a hello captured and
// replayed on another connection, a client stream spliced onto a second connection, a
// confirmation without a proof, and a proof from another connection or made of garbage
// each fail that handshake (or, when the client says it gave up, fall back with
// ErrPathUnproven), and the Listener keeps serving. The hellos carry no ring address or
// key: each side's ring is revealed only in its proof, over a QP whose peer has proved
// itself, so nobody who sees or replays the bootstrap bytes learns a ring's key. The
// proofs travel in plaintext over the fabric, like the data after them; they keep a
// party on the bootstrap connection alone from reaching RDMA, not a party able to
// read or forge RoCE packets on the fabric's network.
//
// # Lossless traffic classes
//
// [Config.TrafficClass] and [Config.ServiceLevel] put the connection's queue pair in the
// class a lossless (PFC) RoCE fabric reserves for RDMA: the traffic class is the IP
// header's (DSCP<<2 | ECN) for RoCE v2, the service level the device maps to a VLAN
// priority. [Config.RoCEVersion] prefers a RoCE version's GID. All default to zero, the
// device's defaults.
//
// # The hello on the wire
//
// All integers are big-endian. Each hello is an 8-byte header and a body of at most
// 504 bytes:
//
//	magic 0x89 'R' 'S' 'K' (4) | version (1) | kind (1) | body length (2) | body
//
// The header is the same in every version, so that any version can frame and skip
// another's. Kind 1 is the client's offer, 2 the server's accept, 3 its decline. In
// version 2, an offer's or accept's body is a 32-bit capability set, whose bit 0 says
// an RDMA endpoint follows (an accept always has it):
//
//	GID (16) | LID (2) | MTU (1) | ring size log2 (1) | QPN (4) | first PSN (4) |
//	receive WQEs (4) | max inline (4) | nonce (16)
//
// QPN and PSN are 24-bit numbers; the MTU is numbered as in package verbs (1 = 256
// bytes to 5 = 4096); the receive ring is a power of two from 4 KiB to 1 GiB; the
// receive WQEs are the peer's initial work-request credit; the nonce is random and
// fresh. (Version 1 carried the ring's rkey and address here, and no nonce.) A
// decline's body is one byte, its reason: 1 no provider, 2 no device, 3 peer offered
// none, 4 version mismatch, 5 resources exhausted, 6 MTU mismatch, 7 no route, 8 engine
// unavailable, 9 upgrade failed. A body longer than its kind needs is accepted and the
// rest ignored (fields are appended within a version). A server that receives another
// version's offer (version 1's included) declines it, in its own version, with reason
// 4, and both sides stay on the bootstrap connection. hello.go draws the format bit by
// bit.
//
// After an accept, each side sends its proof as one RDMA SEND, the first message on its
// QP, into a receive buffer the peer posted for it ahead of its flow-controlled ones:
//
//	0x89 'R' 'P' (3) | role 'C' or 'S' (1) | client nonce (16) | server nonce (16) |
//	ring rkey (4) | ring address (8)
//
// Then the client sends one byte on the bootstrap connection: 'R' (proven: RDMA), 'P'
// (path unproven: stay) or 'F' (its QP could not connect: stay). proof.go and
// upgrade.go draw and explain the exchange.
package rsock
