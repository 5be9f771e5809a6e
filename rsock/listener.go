package rsock

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rsockio/rsock/fallback"
	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// Listener accepts rsock connections. It implements [net.Listener]; Accept returns
// [*Conn] values, and [Listener.AcceptRsock] returns them typed.
//
// A Listener runs each new connection's handshake in its own goroutine, so a slow or
// broken client never holds up Accept: a handshake that fails or overruns
// Config.HandshakeTimeout closes that connection only, and is reported to
// Config.Logger. At most Config.MaxConcurrentHandshakes connections are in their
// handshake or waiting for Accept at once.
//
// With Config.Fallback set to FallbackQUIC, the Listener serves QUIC on UDP and TCP on
// the same port number.
type Listener struct {
	cfg  *Config // resolved
	tcp  *net.TCPListener
	quic *fallback.QUICListener // nil without FallbackQUIC

	budget *listenerBudget // RDMA resources its clients hold (limits.go)
	spare  spareEndpoint   // an endpoint prepared for the next client (spare.go)

	conns  chan *Conn    // handshaken connections, to Accept
	slots  chan struct{} // one token per connection in its handshake or waiting for Accept
	ctx    context.Context
	cancel context.CancelFunc // called by Close: ends handshakes and loops
	wg     sync.WaitGroup
	once   sync.Once

	mu       sync.Mutex
	closed   bool
	inflight map[net.Conn]struct{} // connections in their handshake, closed by Close
}

// Listen listens on address on the named network ("tcp", "tcp4" or "tcp6") with cfg
// (nil for defaults).
func Listen(network, address string, cfg *Config) (*Listener, error) {
	rc, err := cfg.resolve()
	if err != nil {
		return nil, fmt.Errorf("rsock: listen %s: %w", address, err)
	}
	if err := checkNetwork(network); err != nil {
		return nil, fmt.Errorf("rsock: listen %s: %w", address, err)
	}
	l := &Listener{
		cfg:      rc,
		budget:   newListenerBudget(rc),
		conns:    make(chan *Conn),
		slots:    make(chan struct{}, rc.MaxConcurrentHandshakes),
		inflight: make(map[net.Conn]struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	switch rc.Fallback {
	case FallbackQUIC:
		l.tcp, l.quic, err = fallback.ListenTCPAndQUIC(network, address, rc.KeepAlive, &fallback.QUICOptions{
			TLSConfig:     rc.TLSConfig,
			QUICConfig:    rc.QUICConfig,
			KeepAlive:     rc.KeepAlive,
			StreamTimeout: rc.HandshakeTimeout,
			MaxPending:    rc.MaxConcurrentHandshakes,
		})
	default:
		l.tcp, err = fallback.ListenTCP(network, address, rc.KeepAlive)
	}
	if err != nil {
		l.cancel()
		return nil, fmt.Errorf("rsock: listen %s: %w", address, err)
	}
	l.wg.Add(1)
	go l.acceptLoop(l.tcp, TransportTCP)
	if l.quic != nil {
		l.wg.Add(1)
		go l.acceptLoop(l.quic, TransportQUIC)
	}
	return l, nil
}

// Accept waits for the next connection whose handshake has completed and returns it
// as a [*Conn]. After Close it returns an error matching [net.ErrClosed].
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptRsock()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptRsock is Accept returning the connection's concrete type.
func (l *Listener) AcceptRsock() (*Conn, error) {
	select {
	case c := <-l.conns:
		c.st.opened(c, l.cfg, false)
		return c, nil
	case <-l.ctx.Done():
		return nil, fmt.Errorf("rsock: accept on %s: %w", l.tcp.Addr(), net.ErrClosed)
	}
}

// Close stops listening, aborts the handshakes in progress and closes the connections
// not yet accepted. Connections already accepted stay open. Close returns once all of
// the Listener's goroutines have ended. A device stays open for a while after its last
// RDMA connection, so that the next one sets up faster; Close also ends that for the
// Listener's provider: its idle devices close at once, and those in use close with
// their last connection (until a new connection on the provider).
func (l *Listener) Close() error {
	var err error
	first := false
	l.once.Do(func() {
		first = true
		l.mu.Lock()
		l.closed = true
		l.cancel()
		for c := range l.inflight {
			c.Close()
		}
		l.inflight = nil
		l.mu.Unlock()
		err = l.tcp.Close()
		if l.quic != nil {
			l.quic.Close()
		}
		l.wg.Wait()
		l.spare.close()
		if p, perr := l.cfg.provider(); perr == nil {
			rdma.Cool(p) // nobody to report a device's closing error to
		}
	})
	if !first {
		return fmt.Errorf("rsock: close listener on %s: %w", l.tcp.Addr(), net.ErrClosed)
	}
	if err != nil {
		return fmt.Errorf("rsock: close listener: %w", err)
	}
	return nil
}

// Addr returns the TCP address the Listener listens on.
func (l *Listener) Addr() net.Addr { return l.tcp.Addr() }

// QUICAddr returns the UDP address of the Listener's QUIC side, or nil without
// FallbackQUIC.
func (l *Listener) QUICAddr() net.Addr {
	if l.quic == nil {
		return nil
	}
	return l.quic.Addr()
}

// acceptLoop accepts connections from ln, while a slot is free, until it accepts one:
// then it starts another acceptLoop and runs that connection's handshake itself. The
// handshake starts at once, on the goroutine the kernel's news of the connection woke,
// rather than after a new goroutine is scheduled (which here follows the next, idle,
// accept call); the next connection's acceptor is started meanwhile. Each connection
// in its handshake still has one goroutine, and one goroutine accepts.
func (l *Listener) acceptLoop(ln net.Listener, transport string) {
	defer l.wg.Done()
	growStack()
	var backoff time.Duration
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		raw, err := ln.Accept()
		if err != nil {
			<-l.slots
			if l.isClosed() {
				return
			}
			// Out of file descriptors, say: wait and retry, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.cfg.Logger.Warn("rsock: accept failed", "transport", transport, "err", err, "retry", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-l.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		boot, ok := raw.(bootConn)
		if !ok { // cannot happen: fallback's listeners return *net.TCPConn and *QUICConn
			raw.Close()
			<-l.slots
			continue
		}
		if !l.track(boot) {
			raw.Close()
			<-l.slots
			return
		}
		l.wg.Add(1)
		go l.acceptLoop(ln, transport)
		l.serve(boot, transport)
		return
	}
}

// serve runs one connection's handshake, in the slot acceptLoop took for it, and hands
// the connection to Accept.
func (l *Listener) serve(raw bootConn, transport string) {
	defer func() { <-l.slots }()
	c, err := l.handshake(raw, transport)
	if err == nil {
		if err = l.secureAccepted(c, transport); err != nil { // secure.go
			c.Close()
		}
	}
	l.untrack(raw)
	if err == nil && (c.transport == TransportRDMA || c.transport == TransportRDMATLS) {
		c.listener = l // its Close prepares the Listener's spare endpoint (spare.go)
	}
	if err != nil {
		if !l.isClosed() {
			metrics.handshakeFailed(err)
			l.logHandshakeFailure(raw.RemoteAddr(), transport, err) // listener_log.go
		}
		raw.Close()
		return
	}
	l.logAccepted(c)
	select {
	case l.conns <- c:
	case <-l.ctx.Done():
		c.Close()
	}
}

func (l *Listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.inflight[c] = struct{}{}
	return true
}

func (l *Listener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.inflight, c)
	l.mu.Unlock()
}

func (l *Listener) isClosed() bool {
	select {
	case <-l.ctx.Done():
		return true
	default:
		return false
	}
}

var _ net.Listener = (*Listener)(nil)

// handshakeStack is about the stack a server's handshake takes: the hello, the
// endpoint's preparation on the device, the queue pair's connection and the proof.
const handshakeStack = 12 << 10

// growStack grows the calling goroutine's stack to take a handshake, while the stack
// is still shallow. Each acceptLoop is a new goroutine, whose stack starts small (2
// KiB) and would otherwise grow by doublings deep inside its handshake, each one
// copying the frames below it: a third of the server's endpoint preparation went
// there. Grown as the acceptor starts, before it waits in Accept, it costs a new
// stack and a copy of almost nothing, off the path from the client's dial to its
// answer. A stack the garbage collector finds mostly unused shrinks again, and grows
// again when needed, as any goroutine's does. Measured in rsockperf's setup workload
// (from the server's hello read to its endpoint prepared, medians): 24 µs before,
// 12 µs after.
//
//go:noinline
func growStack() {
	var frame [handshakeStack]byte
	useFrame(frame[:])
}

// useFrame keeps growStack's frame from being optimized away.
//
//go:noinline
func useFrame(b []byte) { b[len(b)-1] = 0 }
