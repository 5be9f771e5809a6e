package fallback

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/quic-go/quic-go"
)

// QUICListener accepts QUIC connections as [QUICConn]s. It implements [net.Listener].
//
// Each connection is handed out once its stream has arrived (see [QUICConn]); waiting
// for that happens concurrently for all connections, so a client that completes the
// QUIC handshake but never writes does not hold up Accept. It is closed after
// [QUICOptions.StreamTimeout]. At most [QUICOptions.MaxPending] connections wait for
// their stream or for Accept; beyond that, new connections wait in quic-go's queue.
type QUICListener struct {
	ln   *quic.Listener
	tr   *sharedTransport
	opts QUICOptions

	conns   chan *QUICConn
	pending chan struct{} // one token per connection waiting for its stream or for Accept
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
}

// ListenQUIC listens for QUIC connections on address. network is a TCP or UDP network
// name (see the package documentation).
func ListenQUIC(network, address string, opts *QUICOptions) (*QUICListener, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("fallback: listen quic %s: %w", address, err)
	}
	udpNet, err := udpNetwork(network)
	if err != nil {
		return nil, err
	}
	laddr, err := net.ResolveUDPAddr(udpNet, address)
	if err != nil {
		return nil, fmt.Errorf("fallback: listen quic %s: %w", address, err)
	}
	pc, err := net.ListenUDP(udpNet, laddr)
	if err != nil {
		return nil, fmt.Errorf("fallback: listen quic %s: %w", address, err)
	}
	tr := &sharedTransport{tr: &quic.Transport{Conn: pc}, pc: pc, refs: 1}
	ln, err := tr.tr.Listen(o.tls(""), o.quic(true))
	if err != nil {
		tr.release()
		return nil, fmt.Errorf("fallback: listen quic %s: %w", address, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &QUICListener{
		ln:      ln,
		tr:      tr,
		opts:    o,
		conns:   make(chan *QUICConn),
		pending: make(chan struct{}, o.MaxPending),
		ctx:     ctx,
		cancel:  cancel,
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// acceptLoop takes connections from quic-go and starts waiting for each one's stream.
func (l *QUICListener) acceptLoop() {
	defer l.wg.Done()
	for {
		select {
		case l.pending <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		qc, err := l.ln.Accept(l.ctx)
		if err != nil { // only when closed: quic-go reports nothing else here
			<-l.pending
			return
		}
		if !l.tr.acquire() {
			qc.CloseWithError(codeRefused, "listener closed")
			<-l.pending
			return
		}
		context.AfterFunc(qc.Context(), l.tr.release)
		l.wg.Add(1)
		go l.awaitStream(qc)
	}
}

// awaitStream waits for the dialer's stream and hands the connection to Accept.
func (l *QUICListener) awaitStream(qc *quic.Conn) {
	defer l.wg.Done()
	defer func() { <-l.pending }()
	ctx, cancel := context.WithTimeout(l.ctx, l.opts.StreamTimeout)
	str, err := qc.AcceptStream(ctx)
	cancel()
	if err != nil {
		qc.CloseWithError(codeNoStream, "no stream")
		return
	}
	c := newQUICConn(qc, str, l.opts.Linger)
	select {
	case l.conns <- c:
	case <-l.ctx.Done():
		qc.CloseWithError(codeRefused, "listener closed")
	}
}

// Accept waits for the next connection and returns it as a [*QUICConn].
func (l *QUICListener) Accept() (net.Conn, error) {
	c, err := l.AcceptQUIC()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptQUIC is Accept with the connection's concrete type.
func (l *QUICListener) AcceptQUIC() (*QUICConn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "quic", Addr: l.Addr(), Err: net.ErrClosed}
	}
}

// Close stops accepting. Connections not yet accepted are closed; accepted ones are
// not, and the UDP socket stays open until the last of them ends.
func (l *QUICListener) Close() error {
	first := false
	l.once.Do(func() {
		first = true
		l.cancel()
		l.ln.Close()
		l.wg.Wait()
		// Connections that finished the QUIC handshake after the accept loop stopped.
		for {
			qc, err := l.ln.Accept(context.Background())
			if err != nil {
				break
			}
			qc.CloseWithError(codeRefused, "listener closed")
		}
		l.tr.release()
	})
	if !first {
		return &net.OpError{Op: "close", Net: "quic", Addr: l.Addr(), Err: net.ErrClosed}
	}
	return nil
}

// Addr returns the local UDP address.
func (l *QUICListener) Addr() net.Addr { return l.ln.Addr() }

var _ net.Listener = (*QUICListener)(nil)
