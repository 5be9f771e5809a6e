package rsock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs"
)

// This file is the seam between the connection setup and the RDMA stream engine.
// Everything RDMA-specific that the setup needs goes through offerRDMA (client side)
// and acceptRDMA (server side); the rest of the package knows nothing of queue pairs.
//
// Both run on the bootstrap connection (TCP or QUIC) before the Conn exists, with the
// connection's deadline set to the end of the handshake and ctx ending with it (or when
// the Dial is cancelled, or the Listener closes). Both return an upgrade:
//
//   - data non-nil: the upgrade succeeded. The Conn moves its bytes through data and
//     keeps the bootstrap connection open as the control channel; Conn.Close closes
//     data, then the bootstrap connection.
//   - data nil: the connection stays on the bootstrap transport, and reason (a
//     *FallbackError) says why. replied tells whether the hello exchange has already
//     taken place. If not, the caller completes it: the client sends an offer without
//     RDMA (and reads the server's answer lazily, at the first Read), the server
//     declines with declineReasonOf(reason).
//
// After an accept, the client confirms with one byte on the bootstrap connection:
// confirmReady once its QP is in RTS (the server may then treat the connection as
// RDMA), or confirmFailed if it could not connect (both sides stay on the bootstrap
// transport, the server's reason being ErrUpgradeFailed from the peer). The server
// connects its QP before it sends the accept, so data the client writes right after its
// confirmation finds a QP ready to receive.
//
// A non-nil error fails the connection. It is for a broken bootstrap connection or a
// peer that breaks the protocol; a missing device or a peer that declines is a reason,
// not an error.
//
// writeHello and helloReader (hello.go) exchange hellos on the bootstrap connection.

// Confirmation bytes, sent by the client after an accept.
const (
	confirmReady  = 'R'
	confirmFailed = 'F'
)

// upgrade is the outcome of offerRDMA or acceptRDMA.
type upgrade struct {
	data    stream // the RDMA data path, or nil
	reason  error  // why not RDMA, when data is nil
	replied bool   // the hello exchange is complete
}

// dialState is the client side of a connection being set up.
type dialState struct {
	cfg       *Config  // resolved
	boot      bootConn // the bootstrap connection; no hello has been sent on it yet
	transport string   // TransportTCP or TransportQUIC
}

// offerRDMA tries to upgrade a dialed connection to RDMA. It runs before any hello was
// sent. To upgrade, it sends an offer with this side's RDMA endpoint, waits for the
// server's answer and connects the queue pairs.
func (d *dialState) offerRDMA(ctx context.Context) (upgrade, error) {
	ep, reason, err := prepareEndpoint(ctx, d.cfg, d.boot, nil)
	if err != nil {
		return upgrade{}, err
	}
	if reason != nil {
		return upgrade{reason: reason}, nil
	}
	offer := rdmaEndpoint(ep.Offer())
	if err := writeHello(d.boot, offerHello(&offer)); err != nil {
		ep.Abort()
		return upgrade{}, fmt.Errorf("send hello: %w", err)
	}
	var hr helloReader
	h, err := hr.read(d.boot)
	switch {
	case errors.Is(err, ErrVersionMismatch) && h.kind == helloDecline:
		ep.Abort()
		return upgrade{reason: &FallbackError{Peer: true, Err: err}, replied: true}, nil
	case err != nil:
		ep.Abort()
		return upgrade{}, fmt.Errorf("server hello: %w", err)
	case h.kind == helloDecline:
		ep.Abort()
		return upgrade{reason: &FallbackError{Peer: true, Err: h.reason.err()}, replied: true}, nil
	case h.kind != helloAccept || !h.offersRDMA():
		ep.Abort()
		return upgrade{}, fmt.Errorf("server hello: %w: an %v where an answer belongs", ErrBadHello, h.kind)
	}
	conn, err := ep.Connect(rdma.Offer(h.rdma), d.boot, d.cfg.rdmaKeepAlive())
	if err != nil {
		ep.Abort()
		if _, werr := d.boot.Write([]byte{confirmFailed}); werr != nil {
			return upgrade{}, fmt.Errorf("send confirmation: %w", werr)
		}
		return upgrade{reason: &FallbackError{Err: connectReason(err)}, replied: true}, nil
	}
	if _, err := d.boot.Write([]byte{confirmReady}); err != nil {
		conn.Abandon()
		return upgrade{}, fmt.Errorf("send confirmation: %w", err)
	}
	conn.Start()
	return upgrade{data: conn}, nil
}

// acceptState is the server side of a connection being set up.
type acceptState struct {
	cfg       *Config  // resolved
	boot      bootConn // the bootstrap connection; the client's offer has been read
	transport string   // TransportTCP or TransportQUIC

	// budget is charged for the endpoint: the Listener's, seen from the client's
	// address (limits.go).
	budget rdma.Budget
}

// acceptRDMA answers a client's offer that carries an RDMA endpoint. To upgrade, it
// prepares this side's endpoint, connects its QP to the client's, sends an accept
// carrying it and waits for the client's confirmation.
func (a *acceptState) acceptRDMA(ctx context.Context, offer *hello) (upgrade, error) {
	ep, reason, err := prepareEndpoint(ctx, a.cfg, a.boot, a.budget)
	if err != nil {
		return upgrade{}, err
	}
	if reason != nil {
		return upgrade{reason: reason}, nil
	}
	conn, err := ep.Connect(rdma.Offer(offer.rdma), a.boot, a.cfg.rdmaKeepAlive())
	if err != nil {
		ep.Abort()
		return upgrade{reason: &FallbackError{Err: connectReason(err)}}, nil
	}
	if err := writeHello(a.boot, acceptHello(rdmaEndpoint(ep.Offer()))); err != nil {
		conn.Abandon()
		return upgrade{}, fmt.Errorf("send hello: %w", err)
	}
	var confirm [1]byte
	if _, err := io.ReadFull(a.boot, confirm[:]); err != nil {
		conn.Abandon()
		return upgrade{}, fmt.Errorf("read confirmation: %w", err)
	}
	switch confirm[0] {
	case confirmReady:
		conn.Start()
		return upgrade{data: conn}, nil
	case confirmFailed:
		conn.Abandon()
		return upgrade{reason: &FallbackError{Peer: true, Err: ErrUpgradeFailed}, replied: true}, nil
	}
	conn.Abandon()
	return upgrade{}, fmt.Errorf("%w: confirmation byte %#x", ErrBadHello, confirm[0])
}

// prepareEndpoint creates this side's RDMA endpoint for boot, or returns why it cannot
// (reason, a *FallbackError). ctx bounds it (the handshake's context: the dial's or the
// Listener's, ending with the handshake timeout); when ctx ends first, the endpoint is
// not prepared and err, matching ctx.Err(), fails the handshake: a device too slow to
// list or open within the handshake timeout is not a reason to overrun it. budget, if
// not nil, is charged for the endpoint's QP and registered memory.
func prepareEndpoint(ctx context.Context, cfg *Config, boot bootConn, budget rdma.Budget) (ep *rdma.Endpoint, reason, err error) {
	p, err := cfg.provider()
	if err != nil {
		return nil, &FallbackError{Err: err}, nil
	}
	ip, ok := localIP(boot)
	if !ok {
		return nil, &FallbackError{Err: fmt.Errorf("%w: no local IP address for %v", ErrNoDevice, boot.LocalAddr())}, nil
	}
	opts := cfg.rdmaOptions()
	opts.Budget = budget
	ep, err = rdma.PrepareContext(ctx, p, ip, opts)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, nil, fmt.Errorf("prepare rdma endpoint: %w", ctx.Err())
	case err != nil:
		return nil, &FallbackError{Err: prepareReason(p, err)}, nil
	}
	return ep, nil, nil
}

// localIP is the address the RDMA device is chosen by: the bootstrap connection's local
// IP. A QUIC socket bound to the wildcard address does not know it; on loopback the
// remote address is the local one.
func localIP(c bootConn) (netip.Addr, bool) {
	addrOf := func(a net.Addr) netip.Addr {
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return ap.Addr().Unmap()
		}
		return netip.Addr{}
	}
	ip := addrOf(c.LocalAddr())
	if ip.IsValid() && !ip.IsUnspecified() {
		return ip, true
	}
	if r := addrOf(c.RemoteAddr()); r.IsLoopback() {
		return r, true
	}
	return netip.Addr{}, false
}

// prepareReason turns a failure to prepare an endpoint into a fallback reason.
func prepareReason(p verbs.Provider, err error) error {
	var limit *limitError
	switch {
	case errors.As(err, &limit):
		return fmt.Errorf("%w: %w", ErrResourcesExhausted, limit)
	case errors.Is(err, verbs.ErrNoDevice):
		return fmt.Errorf("%w: provider %s: %w", ErrNoDevice, p.Name(), err)
	case errors.Is(err, rdma.ErrMemoryBudget), errors.Is(err, rdma.ErrMemlock):
		// The engine's text names the limit and the figures.
		return fmt.Errorf("%w: provider %s: %w", ErrResourcesExhausted, p.Name(), err)
	case errors.Is(err, verbs.ErrNoResources), errors.Is(err, rdma.ErrTooManyConns):
		return fmt.Errorf("%w: provider %s: %w", ErrResourcesExhausted, p.Name(), err)
	}
	return fmt.Errorf("%w: provider %s: %w", ErrUpgradeFailed, p.Name(), err)
}

// connectReason turns a failure to connect the QPs into a fallback reason.
func connectReason(err error) error {
	if errors.Is(err, rdma.ErrMTU) {
		return fmt.Errorf("%w: %w", ErrMTUMismatch, err)
	}
	return fmt.Errorf("%w: %w", ErrUpgradeFailed, err)
}

// rdmaOptions are the engine options from a resolved Config.
func (c *Config) rdmaOptions() rdma.Options {
	return rdma.Options{
		RingSize:       c.RingSize,
		GrowRingTo:     c.GrowRingTo,
		SendBufferSize: c.SendBufferSize,
		RecvWQEs:       c.RecvWQEs,
		PollSpin:       c.PollSpin,
		MaxConns:       c.MaxRDMAConns,
		ReadBufferSize: c.ReadBufferSize,
		Linger:         c.Linger,

		MaxRegisteredMemory: c.MaxRegisteredMemory,
	}
}

// rdmaKeepAlive is the control-channel keepalive period of RDMA connections.
func (c *Config) rdmaKeepAlive() time.Duration { return max(c.KeepAlive, 0) }
