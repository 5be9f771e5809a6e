package rsock

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// This file bounds the RDMA resources that clients of a Listener can hold before they
// have proven anything: queue pairs and registered memory, per listener and per remote
// address (Config.MaxRDMAConnsPerRemote and its siblings). The RDMA engine charges every
// QP it creates and every byte it registers for a Listener to the listener's budget,
// through the rdma.Budget each accepted connection gets, before allocating it; a refusal
// allocates nothing, and the connection falls back to its bootstrap transport with a
// reason matching ErrResourcesExhausted that names the limit and its figure. Everything
// is refunded as the endpoint is released (the connection closed, or the handshake
// abandoned).

// usage is what one scope (a listener, or one remote address of it) holds.
type usage struct {
	qps   int
	bytes int64
}

// listenerBudget counts a Listener's RDMA resources, in total and per remote address.
// Connections accepted by the Listener keep charging it after it is closed, until they
// close themselves.
type listenerBudget struct {
	maxQPs, maxQPsRemote     int   // per listener, per remote address; 0: no limit
	maxBytes, maxBytesRemote int64 // the same for registered bytes

	mu     sync.Mutex
	total  usage
	remote map[netip.Prefix]usage // entries are deleted once they hold nothing; by value, so that a connection from a new address allocates no entry of its own (the map may still grow)
}

// newListenerBudget returns the budget of a Listener with resolved configuration cfg.
func newListenerBudget(cfg *Config) *listenerBudget {
	// Negative: no limit.
	return &listenerBudget{
		maxQPs:         max(cfg.MaxRDMAConnsPerListener, 0),
		maxBytes:       max(cfg.MaxRegisteredMemoryPerListener, 0),
		maxQPsRemote:   max(cfg.MaxRDMAConnsPerRemote, 0),
		maxBytesRemote: max(cfg.MaxRegisteredMemoryPerRemote, 0),
		remote:         make(map[netip.Prefix]usage),
	}
}

// remoteKey is the remote address a connection is counted under: its IP for IPv4
// (IPv4-mapped IPv6 included), and its /64 for IPv6, since a host is commonly given a
// whole /64 and can pick any address in it. ok is false for an address that is not IP.
func remoteKey(a net.Addr) (netip.Prefix, bool) {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr: // what TCP gives, without formatting and parsing it
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		var err error
		if ap, err = netip.ParseAddrPort(a.String()); err != nil {
			return netip.Prefix{}, false
		}
	}
	if !ap.Addr().IsValid() {
		return netip.Prefix{}, false
	}
	ip := ap.Addr().WithZone("").Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	return netip.PrefixFrom(ip, bits).Masked(), true
}

// forRemote returns the budget a connection from remote address a charges. A remote
// address that is not IP (which TCP and QUIC never give) is counted in the listener's
// total only. A nil listenerBudget (a Listener built without Listen, in tests) bounds
// nothing: forRemote returns nil.
func (b *listenerBudget) forRemote(a net.Addr) rdma.Budget {
	if b == nil {
		return nil
	}
	key, ok := remoteKey(a)
	return &remoteBudget{b: b, key: key, keyed: ok}
}

// remoteBudget is a listenerBudget seen from one remote address. It implements
// rdma.Budget.
type remoteBudget struct {
	b     *listenerBudget
	key   netip.Prefix
	keyed bool
}

// Charge grants qps queue pairs and bytes registered bytes if neither the remote
// address's limits nor the listener's are passed, or says which would be.
func (r *remoteBudget) Charge(qps, bytes int) error {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	var u *usage
	var held usage
	if r.keyed {
		held = b.remote[r.key]
		u = &held // a local: check formats nothing unless it refuses
	}
	if err := b.check(u, r.key, qps, bytes); err != nil {
		return err
	}
	b.total.qps += qps
	b.total.bytes += int64(bytes)
	if r.keyed {
		held.qps += qps
		held.bytes += int64(bytes)
		b.remote[r.key] = held
	}
	return nil
}

// check returns the first limit that qps and bytes more would pass: the remote
// address's (u, nil when not counted) before the listener's.
func (b *listenerBudget) check(u *usage, key netip.Prefix, qps, bytes int) error {
	over := func(limit, held, asked int64) bool { return limit > 0 && asked > 0 && held+asked > limit }
	q, n := int64(qps), int64(bytes)
	var scope string
	if u != nil { // formatted only for a refusal of the remote address's limits
		if over(int64(b.maxQPsRemote), int64(u.qps), q) || over(b.maxBytesRemote, u.bytes, n) {
			scope = "remote address " + key.String()
			if key.Addr().Is4() {
				scope = "remote address " + key.Addr().String()
			}
		}
	}
	switch {
	case u != nil && over(int64(b.maxQPsRemote), int64(u.qps), q):
		return &limitError{"RDMA connections", scope, "MaxRDMAConnsPerRemote", int64(b.maxQPsRemote), int64(u.qps), q}
	case u != nil && over(b.maxBytesRemote, u.bytes, n):
		return &limitError{memoryLimit, scope, "MaxRegisteredMemoryPerRemote", b.maxBytesRemote, u.bytes, n}
	case over(int64(b.maxQPs), int64(b.total.qps), q):
		return &limitError{"RDMA connections", "the listener", "MaxRDMAConnsPerListener", int64(b.maxQPs), int64(b.total.qps), q}
	case over(b.maxBytes, b.total.bytes, n):
		return &limitError{memoryLimit, "the listener", "MaxRegisteredMemoryPerListener", b.maxBytes, b.total.bytes, n}
	}
	return nil
}

// Refund returns what Charge granted.
func (r *remoteBudget) Refund(qps, bytes int) {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total.qps -= qps
	b.total.bytes -= int64(bytes)
	if !r.keyed {
		return
	}
	if u, ok := b.remote[r.key]; ok {
		u.qps -= qps
		u.bytes -= int64(bytes)
		if u.qps == 0 && u.bytes == 0 {
			delete(b.remote, r.key)
		} else {
			b.remote[r.key] = u
		}
	}
}

// leavesHalf reports whether bytes more registered memory would leave at least half of
// each registered-memory limit that counts this connection free: its remote address's
// and the listener's. A same-host connection takes its large ring only while it does
// (largeRingFits).
func (r *remoteBudget) leavesHalf(bytes int64) bool {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	fits := func(limit, held int64) bool { return limit <= 0 || held+bytes <= limit/2 }
	if r.keyed && !fits(b.maxBytesRemote, b.remote[r.key].bytes) {
		return false
	}
	return fits(b.maxBytes, b.total.bytes)
}

// memoryLimit is a limitError's what for the registered-memory limits.
const memoryLimit = "bytes of registered memory"

// limitError is a refusal by a Listener's budget. Its text names the limit, its figure,
// what was held and what was asked, and the Config field that sets it:
//
//	limit of 8192 RDMA connections for remote address 10.0.0.7 reached: 8192 held, 1 more asked (Config.MaxRDMAConnsPerRemote)
type limitError struct {
	what  string // "RDMA connections", "bytes of registered memory"
	scope string // "remote address 10.0.0.7", "the listener"
	field string // the Config field
	limit int64
	held  int64
	asked int64
}

func (e *limitError) Error() string {
	return fmt.Sprintf("limit of %d %s for %s reached: %d held, %d more asked (Config.%s)",
		e.limit, e.what, e.scope, e.held, e.asked, e.field)
}

// Is makes a limit refusal match ErrResourcesExhausted.
func (e *limitError) Is(target error) bool { return target == ErrResourcesExhausted }
