// Package fallback holds the transports rsock runs on when a connection does not use
// RDMA, and on which every rsock connection starts: TCP and QUIC, each as a [net.Conn]
// and a [net.Listener].
//
// TCP needs little: [DialTCP] and [ListenTCP] return the standard library's own types
// with keep-alive set, so copies to and from them keep the kernel's splice and sendfile
// paths. QUIC (github.com/quic-go/quic-go) needs more work to behave as a net.Conn, and
// most of this package is about that: [QUICConn], [QUICListener] and [DialQUIC].
//
// # QUIC connections as net.Conn
//
// A [QUICConn] is one QUIC connection carrying one bidirectional stream. The dialer opens
// the stream; the listener's peer may open no other bidirectional stream. A QUIC stream
// becomes visible to the listening side only when its first byte (or its FIN) arrives,
// so the dialing side must write first. rsock always does: its hello is the first
// message on every connection. A dialed connection whose first byte does not arrive
// within [QUICOptions.StreamTimeout] is closed by the listener, which is why a stalled
// client never blocks [QUICListener.Accept].
//
// Reads, writes and deadlines map onto the stream and behave as net.Conn requires:
// a deadline in the past fails pending and future calls with an error whose Timeout
// method reports true (and that matches [os.ErrDeadlineExceeded]); Close makes pending
// calls return an error matching [net.ErrClosed]. CloseWrite sends the stream's FIN
// after everything written before it, as TCP's half-close does.
//
// # Closing
//
// Closing a QUIC stream only closes its sending direction, and closing a QUIC
// connection discards whatever was not yet delivered. Close therefore does not tear the
// connection down at once. It sends the stream's FIN behind the data already written,
// then, in the background, discards whatever the peer still sends until the peer's FIN,
// and tells the peer "everything you sent has arrived" with an empty unidirectional
// stream. Either side closes the QUIC connection once it has both received the peer's
// FIN and been told by the peer that its own data arrived; at that point neither
// direction has anything left in flight. A peer that never finishes is cut off after
// [QUICOptions.Linger]. An application that read to io.EOF has already sent its half of
// this exchange, so the peer's linger ends as soon as the peer closes too.
//
// A [QUICListener] shares one UDP socket among its connections; the socket stays open
// after [QUICListener.Close] until the last accepted connection has ended, so that, as
// with TCP, closing a listener does not cut off the connections it accepted.
//
// # TCP and QUIC on one port
//
// [ListenTCPAndQUIC] listens on TCP and on UDP at the same port number, so that one
// address serves clients of either transport. With port 0 it picks a free TCP port and
// retries a few times if that port number is taken on UDP.
//
// # Network names
//
// Functions take the network names of package net. "tcp", "tcp4" and "tcp6" name TCP,
// and for QUIC they select the matching UDP family; "udp", "udp4" and "udp6" are
// accepted for QUIC too.
package fallback
