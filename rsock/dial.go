package rsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// Dial connects to address on the named network ("tcp", "tcp4" or "tcp6") with cfg
// (nil for defaults). See [Dialer.DialContext].
func Dial(network, address string, cfg *Config) (*Conn, error) {
	d := Dialer{Config: cfg}
	return d.DialRsock(context.Background(), network, address)
}

// Dialer dials rsock connections. Its DialContext fits
// [net/http.Transport.DialContext], and its DialAddr fits grpc.WithContextDialer.
// The zero value dials with default settings. Besides Config, it has the fields of
// [net.Dialer] a client most often sets, with the same meaning.
type Dialer struct {
	// Config is the configuration; nil means the defaults.
	Config *Config

	// LocalAddr is the local address to dial from: a *net.TCPAddr (or a *net.UDPAddr)
	// whose IP and port the bootstrap connection binds, over TCP or, with
	// FallbackQUIC, UDP. Nil lets the system choose. It also chooses the RDMA device:
	// on RoCE the device and GID are the ones that hold the bootstrap connection's
	// local IP, so on a host with several RDMA NICs LocalAddr picks the NIC.
	LocalAddr net.Addr
	// Timeout, if positive, bounds the whole dial, connection and handshake, as a
	// deadline on DialContext's ctx would: a dial that overruns it returns an error
	// matching context.DeadlineExceeded. It adds to Config.HandshakeTimeout, which
	// bounds the handshake alone.
	Timeout time.Duration
	// KeepAlive, if not zero, replaces Config.KeepAlive for this Dialer's
	// connections (the bootstrap connection's keep-alive period and, over RDMA, the
	// liveness probe's); negative disables keep-alive.
	KeepAlive time.Duration
	// Control, if not nil, is called with the bootstrap socket before it connects
	// (TCP) or binds (QUIC's UDP socket), as [net.Dialer.Control] is: to set socket
	// options, a firewall mark, a VRF. Its error fails the dial.
	Control func(network, address string, c syscall.RawConn) error
}

// Dial is DialContext with a background context.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to address on the named network ("tcp", "tcp4" or "tcp6") and
// returns a [*Conn]. ctx bounds the whole setup; once DialContext has returned, ctx no
// longer matters.
//
// Config.HandshakeTimeout bounds everything after the bootstrap connection is
// established: finding and opening the RDMA device, preparing the endpoint, the hello
// exchange, connecting the queue pairs and the confirmation. When ctx ends first,
// DialContext returns an error matching ctx.Err() (context.Canceled or
// context.DeadlineExceeded), as net.Dialer does; when the handshake timeout runs out,
// the error matches os.ErrDeadlineExceeded. A device too slow to open within the
// handshake timeout fails the dial rather than falling back: falling back would
// overrun the bound the caller set.
//
// The connection starts on the configured fallback transport and sends the hello.
// Without an RDMA provider, the hello says so and DialContext returns at once, without
// waiting for the server: a fallback connection costs no extra round trip, and the
// server's answer is read by the first Read. (A peer that is no rsock server therefore
// shows only there, as an error matching [ErrNotRsockPeer].) When this side offers RDMA,
// DialContext waits for the answer, within Config.HandshakeTimeout.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.DialRsock(ctx, network, address)
	if err != nil {
		return nil, err // not a nil *Conn in a non-nil net.Conn
	}
	return c, nil
}

// DialAddr is DialContext on network "tcp". Its signature is the one
// grpc.WithContextDialer takes: grpc.WithContextDialer(d.DialAddr).
func (d *Dialer) DialAddr(ctx context.Context, address string) (net.Conn, error) {
	return d.DialContext(ctx, "tcp", address)
}

// DialRsock is DialContext returning the connection's concrete type.
func (d *Dialer) DialRsock(ctx context.Context, network, address string) (*Conn, error) {
	ds := &dialState{} // with the resolved Config inside: one allocation for both
	if err := d.Config.resolveInto(&ds.config); err != nil {
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
	cfg := &ds.config
	if err := checkNetwork(network); err != nil {
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
	if d.KeepAlive != 0 {
		cfg.KeepAlive = d.KeepAlive // cfg is resolve's copy
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	if cfg.Fallback == FallbackQUIC {
		if host, _, err := net.SplitHostPort(address); err == nil {
			cfg = withServerName(cfg, host) // the TLS over RDMA verifies what QUIC verifies
		}
	}
	boot, transport, err := d.dialBoot(ctx, cfg, network, address) // dialer.go
	if err = ctxError(ctx, err); err != nil {
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
	ds.cfg, ds.boot, ds.transport = cfg, boot, transport
	c, err := clientHandshake(ctx, ds)
	if err != nil {
		boot.Close()
		metrics.handshakeFailed(err)
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
	c.st.opened(c, cfg, true)
	return c, nil
}

// clientHandshake runs the client's side of the hello on a new bootstrap connection.
//
// Every step is bounded by ctx and by the handshake timeout: the bootstrap connection's
// deadline covers the hello exchange and the confirmation, and a context ending at the
// same time covers the steps that do not touch it (listing and opening the RDMA device,
// preparing the endpoint). A dial whose ctx ends returns ctx's error, as net.Dialer
// does; a handshake that runs out of time returns an error matching
// os.ErrDeadlineExceeded, whichever step it was in.
func clientHandshake(ctx context.Context, d *dialState) (*Conn, error) {
	bound := bindDeadline(ctx, d.boot, d.cfg.HandshakeTimeout)
	hctx := &d.hctx // context.WithTimeout's, without a timer unless something waits on it
	hctx.init(ctx, time.Now().Add(d.cfg.HandshakeTimeout))
	c, err := d.handshake(hctx)
	timedOut := hctx.Err() != nil && ctx.Err() == nil
	hctx.release()
	if cerr := bound.stop(); cerr != nil {
		err = cerr // the handshake was cut short, or finished just as ctx ended
	}
	if err != nil && timedOut && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (handshake timeout %v): %w", err, d.cfg.HandshakeTimeout, os.ErrDeadlineExceeded)
	}
	if err = ctxError(ctx, err); err != nil { // dialer.go: a ctx that ended shows in err
		if c != nil {
			c.Close()
		}
		return nil, err
	}
	return c, nil
}

func (d *dialState) handshake(ctx context.Context) (*Conn, error) {
	up, err := d.offerRDMA(ctx)
	if err != nil {
		return nil, err
	}
	if up.data != nil {
		c := newUpgradedConn(d.boot, up)
		return c, secureClient(ctx, c, d.cfg) // secure.go: no plaintext under a QUIC bootstrap
	}
	c := newConn(d.boot, d.transport, up.reason)
	if !up.replied {
		if err := d.sendHello(offerHello(nil)); err != nil {
			return nil, err
		}
		c.expectReply(d.cfg.HandshakeTimeout)
	}
	return c, nil
}

// bindDeadline sets conn's deadline to the earlier of ctx's deadline and timeout from
// now, and to the past when ctx ends before stop is called. stop clears the deadline;
// it returns ctx's error if ctx ended first, in which case the deadline is left in the
// past and conn must not be used. A ctx that cannot end (Done returns nil, as
// context.Background's does) costs no watcher.
func bindDeadline(ctx context.Context, conn net.Conn, timeout time.Duration) boundDeadline {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	if ctx.Done() == nil {
		return boundDeadline{ctx: ctx, conn: conn}
	}
	fired := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		conn.SetDeadline(aLongTimeAgo)
		close(fired)
	})
	return boundDeadline{ctx: ctx, conn: conn, stopAfter: stopAfter, fired: fired}
}

// boundDeadline is a connection's deadline bound to a context by bindDeadline.
type boundDeadline struct {
	ctx       context.Context
	conn      net.Conn
	stopAfter func() bool   // nil when ctx cannot end
	fired     chan struct{} // closed once ctx's end has set the deadline in the past
}

// stop unbinds the deadline: see bindDeadline.
func (b boundDeadline) stop() error {
	if b.stopAfter != nil && !b.stopAfter() {
		<-b.fired
		return b.ctx.Err()
	}
	b.conn.SetDeadline(time.Time{})
	return nil
}

// aLongTimeAgo is a deadline in the past: setting it wakes blocked calls.
var aLongTimeAgo = time.Unix(1, 0)

// checkNetwork accepts the network names rsock dials and listens on.
func checkNetwork(network string) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
		return nil
	}
	return net.UnknownNetworkError(network)
}
