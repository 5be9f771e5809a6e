package rsock

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/fallback"
)

// stream is a Conn's data path: the bootstrap connection itself (a *net.TCPConn or a
// *fallback.QUICConn), or the RDMA engine's stream.
type stream interface {
	io.Reader
	io.Writer
	Close() error
	CloseWrite() error
	SetDeadline(t time.Time) error
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
}

// bootConn is a bootstrap connection: a *net.TCPConn or a *fallback.QUICConn.
type bootConn interface {
	net.Conn
	CloseWrite() error
}

// Conn is an rsock connection. It implements [net.Conn], and its methods may be called
// concurrently as net.Conn allows.
//
// [Conn.Transport] tells what carries its bytes, and [Conn.FallbackReason] why that is
// not RDMA. On TCP, Read and Write go straight to the [net.TCPConn], and io.Copy to or
// from a Conn keeps the kernel's splice and sendfile paths ([Conn.ReadFrom],
// [Conn.WriteTo]).
type Conn struct {
	s             stream
	tcp           *net.TCPConn // s, when s is a TCP connection: ReadFrom and WriteTo hand to it
	local, remote net.Addr
	transport     string
	reason        error

	// pending is set while something must happen before the data can be read: the
	// server's answer to a client's hello is still unread (reply), or bytes sniffed from
	// a plain client wait to be handed back (prefix). The first Read does it, under mu;
	// after that, a Read costs one atomic load more than the stream's own.
	pending atomic.Bool
	mu      sync.Mutex
	reply   *helloReader // client: the server's answer, read lazily
	prefix  []byte       // plain client: its first bytes, read while sniffing
	failed  error        // the server's answer was not acceptable; every Read returns it
	// replyTimeout bounds how long a client closed before reading the server's answer
	// keeps its socket open for it (see closeBeforeReply).
	replyTimeout time.Duration

	st connCounters // statistics and tracing (stats.go)

	// listener accepted this connection over RDMA (not shared memory): Close prepares
	// its spare endpoint (spare.go). nil on a client's.
	listener *Listener
}

// newConn returns a Conn whose data path is its bootstrap connection boot.
func newConn(boot bootConn, transport string, reason error) *Conn {
	c := &Conn{
		s:         boot,
		local:     boot.LocalAddr(),
		remote:    boot.RemoteAddr(),
		transport: transport,
		reason:    reason,
	}
	c.tcp, _ = boot.(*net.TCPConn)
	return c
}

// newRDMAConn returns a Conn whose bytes move through data, which keeps boot open as
// its control channel and closes it.
func newRDMAConn(boot bootConn, data stream) *Conn {
	c := &Conn{
		s:         data,
		local:     boot.LocalAddr(),
		remote:    boot.RemoteAddr(),
		transport: TransportRDMA,
	}
	c.st.engine = engineOf(data)
	return c
}

// expectReply makes the first Read consume and check the server's answer to the
// client's hello before any data. timeout bounds the wait for it after an early Close.
func (c *Conn) expectReply(timeout time.Duration) {
	c.reply = new(helloReader)
	c.replyTimeout = timeout
	c.pending.Store(true)
}

// replayPrefix makes the first Reads return b, already read from the connection.
func (c *Conn) replayPrefix(b []byte) {
	if len(b) > 0 {
		c.prefix = b
		c.pending.Store(true)
	}
}

// Transport returns what carries the connection's bytes: "rdma", "rdma+tls", "tcp" or
// "quic". "rdma+tls" is RDMA carrying TLS 1.3, what a connection bootstrapped over QUIC
// gets unless both sides set [Config.AllowPlaintextRDMA]; "rdma" is plaintext RDMA, from
// a TCP bootstrap or with both sides' consent (see the package documentation, Security);
// "shm" is shared memory between two processes of one host ([TransportSHM]).
func (c *Conn) Transport() string { return c.transport }

// FallbackReason returns why the connection does not use RDMA, a [*FallbackError], or
// nil if it does. It is not an error of the connection, which works on its transport.
//
// On the client, it is this side's reason for not offering RDMA (no provider, say);
// the server's answer to an offer without RDMA is checked only at the first Read.
func (c *Conn) FallbackReason() error { return c.reason }

// Read reads data from the connection, as [net.Conn] describes.
//
// On a client, the first Read also consumes the server's answer to the hello, which
// Dial does not wait for. If the peer turns out not to speak rsock, Read fails with an
// error matching [ErrNotRsockPeer], as does every Read after it.
func (c *Conn) Read(p []byte) (int, error) {
	if c.pending.Load() {
		return c.st.didRead(c.readPending(p))
	}
	return c.st.didRead(c.s.Read(p))
}

// readPending is Read while pending is set.
func (c *Conn) readPending(p []byte) (int, error) {
	c.mu.Lock()
	if !c.pending.Load() { // another Read did the work
		c.mu.Unlock()
		return c.s.Read(p)
	}
	if err := c.settleReply(); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		if len(c.prefix) == 0 {
			c.prefix = nil
			c.pending.Store(false)
		}
		c.mu.Unlock()
		return n, nil
	}
	c.pending.Store(false)
	c.mu.Unlock()
	return c.s.Read(p)
}

// settleReply reads and checks the server's answer, if it is still unread. It is called
// with mu held. An interrupted read (a deadline, say) can be resumed by the next call; a
// bad answer is remembered and returned by every call.
func (c *Conn) settleReply() error {
	if c.failed != nil {
		return c.failed
	}
	if c.reply == nil {
		return nil
	}
	h, err := c.reply.read(c.s)
	switch {
	case err == nil && h.kind == helloDecline:
		// The server stays on this transport, as the client asked; its reason adds
		// nothing, the client offered no RDMA.
	case err == nil:
		err = fmt.Errorf("%w: the server answered an offer without RDMA with an %v", ErrBadHello, h.kind)
	case helloErrFinal(err) && h.kind == helloDecline:
		// A server of another version declined, as it must: stay on this transport.
		err = nil
	case !helloErrFinal(err):
		return err
	}
	c.reply = nil
	if err != nil {
		c.failed = fmt.Errorf("rsock: server hello from %s: %w", c.remote, err)
		return c.failed
	}
	return nil
}

// Write writes data to the connection, as [net.Conn] describes.
func (c *Conn) Write(p []byte) (int, error) {
	return c.st.didWrite(c.s.Write(p))
}

// ReadFrom implements [io.ReaderFrom]. On TCP it hands the copy to the
// [net.TCPConn], which uses splice or sendfile where it can; on RDMA the engine reads
// straight into its registered send buffer.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if c.tcp != nil {
		return c.st.didWrite64(c.tcp.ReadFrom(r))
	}
	if rf, ok := c.s.(io.ReaderFrom); ok {
		return c.st.didWrite64(rf.ReadFrom(r))
	}
	return io.Copy(writerOnly{c}, r)
}

// WriteTo implements [io.WriterTo]. On TCP it hands the copy to the [net.TCPConn],
// which uses splice where it can; on RDMA the engine writes out of its receive ring.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	var n int64
	if c.pending.Load() {
		c.mu.Lock()
		err := c.settleReply()
		prefix := c.prefix
		c.prefix = nil
		if err == nil {
			c.pending.Store(false)
		}
		c.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if len(prefix) > 0 {
			m, err := c.st.didRead(w.Write(prefix))
			n += int64(m)
			if err != nil {
				return n, err
			}
		}
	}
	if c.tcp != nil {
		m, err := c.st.didRead64(c.tcp.WriteTo(w))
		return n + m, err
	}
	if wt, ok := c.s.(io.WriterTo); ok {
		m, err := c.st.didRead64(wt.WriteTo(w)) // RDMA: straight out of the receive ring
		return n + m, err
	}
	m, err := io.Copy(w, readerOnly{c})
	return n + m, err
}

// CloseWrite shuts down the writing side: the peer reads io.EOF after the data written
// before, and this side may go on reading. It works on every transport.
func (c *Conn) CloseWrite() error {
	return c.s.CloseWrite()
}

// Close closes the connection. Blocked Reads and Writes return errors matching
// [net.ErrClosed], and so do, on every transport, a second Close and the methods
// called after Close (Read, Write, the deadline setters).
//
// Over RDMA, Close waits up to [Config.Linger] for the peer's device to acknowledge the
// bytes Write accepted and the end of the stream. A nil error means every one of them
// reached the peer. When the connection failed with some still unacknowledged (a path
// or port that died mid-stream), Close returns that failure, and when the linger time
// ran out, an error matching [ErrLingerTimeout]: those bytes may be lost, as with a TCP
// connection reset before its send buffer drained. Write returning is not delivery.
func (c *Conn) Close() error {
	defer c.st.closed(c)
	if c.pending.Load() && c.tcp != nil {
		if closed, err := c.closeBeforeReply(); closed {
			return err
		}
	}
	err := c.s.Close()
	if l := c.listener; l != nil && err == nil {
		if ip, ok := localIP(c); ok {
			l.spare.refill(l.ctx, l.cfg, ip) // spare.go: for the Listener's next client
		}
	}
	return err
}

// closeBeforeReply closes a TCP client connection whose server answer has not been
// read, and reports whether it did.
//
// A TCP socket closed with unread bytes in its receive buffer, or that receives bytes
// after it was closed, is reset by the kernel, and a reset can destroy data the server
// has received but not yet read. An application that writes and closes without
// reading must not lose data to the server's answer, which it never asked for. So the
// connection is half-closed (the server gets the data and a FIN), the Conn is closed as
// the application sees it, and a duplicate of the socket stays open in the background
// until the answer has been read, or for at most the handshake timeout.
func (c *Conn) closeBeforeReply() (bool, error) {
	if !c.mu.TryLock() {
		return false, nil // a Read is taking the answer right now
	}
	defer c.mu.Unlock()
	if c.reply == nil || c.failed != nil {
		return false, nil
	}
	keep, err := dupSocket(c.tcp)
	if err != nil {
		return false, nil
	}
	// Close before the half-close, on the duplicate: a Write racing Close then finds
	// the Conn closed (net.ErrClosed), never a socket whose writing side is shut down
	// (EPIPE).
	err = c.tcp.Close()
	if kt, ok := keep.(*net.TCPConn); ok {
		kt.CloseWrite()
	}
	reply := c.reply
	c.reply = nil
	c.pending.Store(false)
	keep.SetReadDeadline(time.Now().Add(c.replyTimeout))
	go func() {
		reply.read(keep)
		keep.Close()
	}()
	return true, err
}

// LocalAddr returns the local address of the bootstrap connection (a *net.TCPAddr, or
// a *net.UDPAddr for QUIC).
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the remote address of the bootstrap connection.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets the read and write deadlines, as [net.Conn] describes.
func (c *Conn) SetDeadline(t time.Time) error { return c.s.SetDeadline(t) }

// SetReadDeadline sets the read deadline, as [net.Conn] describes.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.s.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline, as [net.Conn] describes.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.s.SetWriteDeadline(t) }

// readerOnly and writerOnly hide a Conn's WriteTo and ReadFrom from io.Copy, which
// would otherwise call back into them.
type (
	readerOnly struct{ io.Reader }
	writerOnly struct{ io.Writer }
)

var (
	_ net.Conn      = (*Conn)(nil)
	_ io.ReaderFrom = (*Conn)(nil)
	_ io.WriterTo   = (*Conn)(nil)
	_ bootConn      = (*net.TCPConn)(nil)
	_ bootConn      = (*fallback.QUICConn)(nil)
)
