package rsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/rsockio/rsock/fallback"
)

// Dial connects to address on the named network ("tcp", "tcp4" or "tcp6") with cfg
// (nil for defaults). See [Dialer.DialContext].
func Dial(network, address string, cfg *Config) (*Conn, error) {
	d := Dialer{Config: cfg}
	return d.DialRsock(context.Background(), network, address)
}

// Dialer dials rsock connections. Its DialContext fits
// [net/http.Transport.DialContext], and its DialAddr fits grpc.WithContextDialer.
// The zero value dials with default settings.
type Dialer struct {
	// Config is the configuration; nil means the defaults.
	Config *Config
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
	cfg, err := d.Config.resolve()
	if err != nil {
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
	if err := checkNetwork(network); err != nil {
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
	var boot bootConn
	transport := TransportTCP
	switch cfg.Fallback {
	case FallbackQUIC:
		transport = TransportQUIC
		if host, _, err := net.SplitHostPort(address); err == nil {
			cfg = withServerName(cfg, host) // the TLS over RDMA verifies what QUIC verifies
		}
		boot, err = fallback.DialQUIC(ctx, network, address, &fallback.QUICOptions{
			TLSConfig:  cfg.TLSConfig,
			QUICConfig: cfg.QUICConfig,
			KeepAlive:  cfg.KeepAlive,
		})
	default:
		boot, err = fallback.DialTCP(ctx, network, address, cfg.KeepAlive)
	}
	if err != nil {
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
	c, err := clientHandshake(ctx, &dialState{cfg: cfg, boot: boot, transport: transport})
	if err != nil {
		boot.Close()
		return nil, fmt.Errorf("rsock: dial %s: %w", address, err)
	}
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
	stop := bindDeadline(ctx, d.boot, d.cfg.HandshakeTimeout)
	hctx, cancel := context.WithTimeout(ctx, d.cfg.HandshakeTimeout)
	c, err := d.handshake(hctx)
	timedOut := hctx.Err() != nil && ctx.Err() == nil
	cancel()
	if cerr := stop(); cerr != nil {
		err = cerr // the handshake was cut short, or finished just as ctx ended
	}
	if err != nil && timedOut && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (handshake timeout %v): %w", err, d.cfg.HandshakeTimeout, os.ErrDeadlineExceeded)
	}
	if err != nil {
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
		if err := writeHello(d.boot, offerHello(nil)); err != nil {
			return nil, fmt.Errorf("send hello: %w", err)
		}
		c.expectReply(d.cfg.HandshakeTimeout)
	}
	return c, nil
}

// bindDeadline sets conn's deadline to the earlier of ctx's deadline and timeout from
// now, and to the past when ctx ends before stop is called. stop clears the deadline;
// it returns ctx's error if ctx ended first, in which case the deadline is left in the
// past and conn must not be used.
func bindDeadline(ctx context.Context, conn net.Conn, timeout time.Duration) (stop func() error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	fired := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		conn.SetDeadline(aLongTimeAgo)
		close(fired)
	})
	return func() error {
		if !stopAfter() {
			<-fired
			return ctx.Err()
		}
		conn.SetDeadline(time.Time{})
		return nil
	}
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
