package workload

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// quicConn is a raw quic-go stream as a net.Conn: one stream on its own QUIC connection,
// with nothing of rsock's in between (no linger protocol, no locks).
//
// Closing a QUIC connection discards what it has not yet delivered. The workloads'
// clients close only once they have everything they wait for, so a client closes at
// once; a server (lingering) sends its FIN and leaves the connection open until the
// client closes it, or for at most quicLinger.
type quicConn struct {
	*quic.Stream
	qc        *quic.Conn
	lingering bool
	once      sync.Once
}

const quicLinger = 10 * time.Second

func (c *quicConn) Close() error {
	c.once.Do(func() {
		c.Stream.Close()
		if !c.lingering {
			c.qc.CloseWithError(0, "")
			return
		}
		go func() {
			t := time.NewTimer(quicLinger)
			defer t.Stop()
			select {
			case <-c.qc.Context().Done():
			case <-t.C:
			}
			c.qc.CloseWithError(0, "")
		}()
	})
	return nil
}

// CloseWrite sends the stream's FIN.
func (c *quicConn) CloseWrite() error    { return c.Stream.Close() }
func (c *quicConn) LocalAddr() net.Addr  { return c.qc.LocalAddr() }
func (c *quicConn) RemoteAddr() net.Addr { return c.qc.RemoteAddr() }

// quicListener accepts QUIC connections and, on each, the stream the client opens.
type quicListener struct {
	ln          *quic.Listener
	conns       chan net.Conn
	done        chan struct{}
	ctx         context.Context
	cancel      context.CancelFunc
	once        sync.Once
	wg          sync.WaitGroup
	closeResult error
}

func (l *quicListener) acceptLoop() {
	for {
		qc, err := l.ln.Accept(l.ctx)
		if err != nil {
			return
		}
		l.wg.Go(func() {
			ctx, cancel := context.WithTimeout(l.ctx, quicLinger)
			defer cancel()
			str, err := qc.AcceptStream(ctx)
			if err != nil {
				qc.CloseWithError(1, "")
				return
			}
			select {
			case l.conns <- &quicConn{Stream: str, qc: qc, lingering: true}:
			case <-l.done:
				qc.CloseWithError(1, "")
			}
		})
	}
}

func (l *quicListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *quicListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.cancel()
		l.closeResult = l.ln.Close()
		l.wg.Wait()
	})
	return l.closeResult
}

func (l *quicListener) Addr() net.Addr { return l.ln.Addr() }

// pipeListener hands out the server ends of in-memory pipes.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// dial returns the client end of a new pipe whose server end Accept returns.
func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	c, s := halfClosablePipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// pipeConn is one end of a pair of net.Pipes, one per direction, so that it can
// half-close (net.Pipe alone cannot): CloseWrite closes the sending pipe, whose other
// end then reads io.EOF.
type pipeConn struct {
	r, w net.Conn
}

func halfClosablePipe() (x, y *pipeConn) {
	xr, yw := net.Pipe()
	yr, xw := net.Pipe()
	return &pipeConn{r: xr, w: xw}, &pipeConn{r: yr, w: yw}
}

func (c *pipeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *pipeConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *pipeConn) CloseWrite() error           { return c.w.Close() }
func (c *pipeConn) Close() error {
	c.w.Close()
	return c.r.Close()
}
func (c *pipeConn) LocalAddr() net.Addr  { return pipeAddr{} }
func (c *pipeConn) RemoteAddr() net.Addr { return pipeAddr{} }
func (c *pipeConn) SetDeadline(t time.Time) error {
	c.r.SetDeadline(t)
	return c.w.SetDeadline(t)
}
func (c *pipeConn) SetReadDeadline(t time.Time) error  { return c.r.SetReadDeadline(t) }
func (c *pipeConn) SetWriteDeadline(t time.Time) error { return c.w.SetWriteDeadline(t) }
