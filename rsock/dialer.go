package rsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/rsockio/rsock/fallback"
)

// dialBoot opens the bootstrap connection on cfg's fallback transport, with the
// Dialer's LocalAddr and Control, and returns it with its transport's name.
func (d *Dialer) dialBoot(ctx context.Context, cfg *Config, network, address string) (bootConn, string, error) {
	if cfg.Fallback == FallbackQUIC {
		laddr, err := udpLocalAddr(d.LocalAddr)
		if err != nil {
			return nil, "", err
		}
		qc, err := fallback.DialQUIC(ctx, network, address, &fallback.QUICOptions{
			TLSConfig:  cfg.TLSConfig,
			QUICConfig: cfg.QUICConfig,
			KeepAlive:  cfg.KeepAlive,
			LocalAddr:  laddr,
			Control:    d.Control,
		})
		if err != nil {
			return nil, "", err
		}
		return qc, TransportQUIC, nil
	}
	laddr, err := tcpLocalAddr(d.LocalAddr)
	if err != nil {
		return nil, "", err
	}
	nd := &net.Dialer{KeepAlive: cfg.KeepAlive, Control: d.Control}
	if laddr != nil { // not a nil *net.TCPAddr in a non-nil net.Addr
		nd.LocalAddr = laddr
	}
	tc, err := fallback.DialTCPWith(ctx, nd, network, address)
	if err != nil {
		return nil, "", err
	}
	return tc, TransportTCP, nil
}

// tcpLocalAddr and udpLocalAddr turn a Dialer's LocalAddr into the address the
// bootstrap socket binds: the same IP, zone and port, whichever of TCP or UDP it was
// given as.
func tcpLocalAddr(a net.Addr) (*net.TCPAddr, error) {
	switch a := a.(type) {
	case nil:
		return nil, nil
	case *net.TCPAddr:
		return a, nil
	case *net.UDPAddr:
		return &net.TCPAddr{IP: a.IP, Port: a.Port, Zone: a.Zone}, nil
	}
	return nil, fmt.Errorf("Dialer.LocalAddr %v is a %T, want a *net.TCPAddr or *net.UDPAddr", a, a)
}

func udpLocalAddr(a net.Addr) (*net.UDPAddr, error) {
	t, err := tcpLocalAddr(a)
	if t == nil || err != nil {
		return nil, err
	}
	return &net.UDPAddr{IP: t.IP, Port: t.Port, Zone: t.Zone}, nil
}

// ctxError returns err, made to match ctx's error when ctx ended or its deadline
// passed, as net.Dialer's errors do. The bootstrap connection's deadline is ctx's
// deadline when that comes first (bindDeadline), so a read cut short by it fails with
// the connection's "i/o timeout" at the very moment ctx expires, possibly before ctx's
// own timer has fired and ctx.Err() says so: the deadline itself is checked too.
func ctxError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
		cerr = context.DeadlineExceeded
	}
	if cerr == nil || errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}
