package fallback

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// Application error codes a QUICConn closes its QUIC connection with.
const (
	codeDone     quic.ApplicationErrorCode = 0 // both directions delivered (see QUICConn.Close)
	codeAbort    quic.ApplicationErrorCode = 1 // the peer did not finish within the linger time
	codeNoStream quic.ApplicationErrorCode = 2 // the dialer opened no stream in time
	codeRefused  quic.ApplicationErrorCode = 3 // the listener closed before the connection was accepted
)

// aLongTimeAgo is a deadline that has passed: setting it wakes blocked calls.
var aLongTimeAgo = time.Unix(1, 0)

// QUICConn is a [net.Conn] over one bidirectional stream of its own QUIC connection.
// See the package documentation for how it closes.
//
// Read and Write may be called concurrently with each other and with every other
// method, as net.Conn requires; concurrent Reads (or Writes) run one at a time.
type QUICConn struct {
	qc     *quic.Conn
	str    *quic.Stream
	linger time.Duration
	local  net.Addr // the socket's address, or the route's source for a wildcard one (localaddr.go)

	// quic-go forbids closing the send side concurrently with a Write, and Close must
	// not drain the receive side while an application Read runs. Reads and Writes hold
	// the read lock of rmu and wmu; Close and CloseWrite take the write locks, after
	// waking blocked calls with a past deadline. dmu orders deadline changes against
	// Close, so that a late SetDeadline cannot undo that wake-up.
	rmu    sync.RWMutex
	wmu    sync.RWMutex
	dmu    sync.Mutex
	closed atomic.Bool

	rxDone   atomic.Bool // the peer's FIN was read
	doneOnce sync.Once   // sends the "all arrived" signal
}

func newQUICConn(qc *quic.Conn, str *quic.Stream, linger time.Duration) *QUICConn {
	return &QUICConn{qc: qc, str: str, linger: linger, local: concreteLocal(qc.LocalAddr(), qc.RemoteAddr())}
}

// Read reads from the stream. It returns io.EOF after the peer's FIN.
func (c *QUICConn) Read(p []byte) (int, error) {
	c.rmu.RLock()
	if c.closed.Load() {
		c.rmu.RUnlock()
		return 0, c.opError("read", net.ErrClosed)
	}
	n, err := c.str.Read(p)
	c.rmu.RUnlock()
	if err != nil {
		err = c.readError(err)
	}
	return n, err
}

func (c *QUICConn) readError(err error) error {
	if err == io.EOF {
		c.finishReceive()
		return io.EOF
	}
	if c.closed.Load() {
		return c.opError("read", net.ErrClosed)
	}
	return c.opError("read", err)
}

// Write writes to the stream. It returns once quic-go has taken all of p, or with an
// error; as with TCP, a timed-out Write may have taken part of p.
func (c *QUICConn) Write(p []byte) (int, error) {
	c.wmu.RLock()
	if c.closed.Load() {
		c.wmu.RUnlock()
		return 0, c.opError("write", net.ErrClosed)
	}
	n, err := c.str.Write(p)
	c.wmu.RUnlock()
	if err != nil {
		if c.closed.Load() {
			err = net.ErrClosed
		}
		err = c.opError("write", err)
	}
	return n, err
}

// CloseWrite sends the stream's FIN after everything written so far: the peer reads
// io.EOF, and this side may still read. It waits for a Write in progress to return.
func (c *QUICConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return c.opError("close", net.ErrClosed)
	}
	if err := c.str.Close(); err != nil {
		return c.opError("close", err)
	}
	return nil
}

// Close closes the connection: pending and future Reads and Writes fail with an error
// matching [net.ErrClosed]. Data written before Close is still delivered; the QUIC
// connection ends in the background once both sides are done, or after the linger time.
func (c *QUICConn) Close() error {
	c.dmu.Lock()
	if c.closed.Swap(true) {
		c.dmu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	c.str.SetDeadline(aLongTimeAgo) // wake blocked Reads and Writes
	c.dmu.Unlock()

	c.wmu.Lock()
	c.str.Close() // FIN behind the data written; a no-op after CloseWrite
	c.wmu.Unlock()
	// A barrier: once rmu is ours, no application Read runs, and none will start.
	// The critical section is empty on purpose.
	c.rmu.Lock()
	//lint:ignore SA2001 an empty critical section is the barrier intended here
	c.rmu.Unlock()
	go c.finish()
	return nil
}

// finish ends a closed connection. It discards what the peer still sends up to its FIN,
// tells the peer that everything arrived, and closes the QUIC connection once the peer
// has said the same, or when the linger time runs out.
func (c *QUICConn) finish() {
	ctx, cancel := context.WithTimeout(c.qc.Context(), c.linger)
	defer cancel()
	code := codeAbort
	if c.drain(ctx) {
		if _, err := c.qc.AcceptUniStream(ctx); err == nil {
			code = codeDone
		}
	}
	c.qc.CloseWithError(code, "")
}

// drain reads and discards up to the peer's FIN, then signals the peer. It reports
// whether the FIN arrived before ctx ended.
func (c *QUICConn) drain(ctx context.Context) bool {
	if !c.rxDone.Load() {
		deadline, _ := ctx.Deadline()
		c.str.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, readerOnly{c.str}); err != nil {
			return false
		}
	}
	c.finishReceive()
	return true
}

// finishReceive records that the peer's FIN was read and tells the peer, once, with an
// empty unidirectional stream: everything it sent has arrived.
func (c *QUICConn) finishReceive() {
	c.rxDone.Store(true)
	c.doneOnce.Do(func() {
		if s, err := c.qc.OpenUniStream(); err == nil {
			s.Close()
		}
	})
}

// LocalAddr returns the local UDP address. When the socket is bound to the wildcard
// address, its IP is the source address of the route to the peer.
func (c *QUICConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's UDP address.
func (c *QUICConn) RemoteAddr() net.Addr { return c.qc.RemoteAddr() }

// SetDeadline sets the read and write deadlines, as [net.Conn] describes.
func (c *QUICConn) SetDeadline(t time.Time) error { return c.setDeadline(c.str.SetDeadline, t) }

// SetReadDeadline sets the read deadline, as [net.Conn] describes.
func (c *QUICConn) SetReadDeadline(t time.Time) error { return c.setDeadline(c.str.SetReadDeadline, t) }

// SetWriteDeadline sets the write deadline, as [net.Conn] describes.
func (c *QUICConn) SetWriteDeadline(t time.Time) error {
	return c.setDeadline(c.str.SetWriteDeadline, t)
}

// setDeadline calls set, one of the stream's deadline setters, unless c is closed.
func (c *QUICConn) setDeadline(set func(time.Time) error, t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.closed.Load() {
		return c.opError("set deadline", net.ErrClosed)
	}
	return set(t)
}

// ConnectionState returns the QUIC connection's state, including its TLS state.
func (c *QUICConn) ConnectionState() quic.ConnectionState { return c.qc.ConnectionState() }

// opError wraps err as the net package does, so callers can use net.Error and errors.Is
// (os.ErrDeadlineExceeded, net.ErrClosed) as with TCP.
func (c *QUICConn) opError(op string, err error) error {
	var ne *net.OpError
	if errors.As(err, &ne) {
		return err
	}
	return &net.OpError{Op: op, Net: "quic", Source: c.qc.LocalAddr(), Addr: c.qc.RemoteAddr(), Err: err}
}

// readerOnly hides everything but Read, so io.Copy uses its own buffer.
type readerOnly struct{ io.Reader }

var _ net.Conn = (*QUICConn)(nil)
