package rdma

import (
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/rsockio/rsock/verbs"
)

// This file pools endpoint shells per device. Preparing an endpoint allocates a
// protection domain and registers its first ring (with the mailbox) and its first
// staging buffer: on verbs/soft three objects and about 12 KiB of zeroed memory, on
// rdma-core three system calls, two of which pin pages. A process that connects, closes
// and connects again would pay all of it each time, on the path from dial to first
// byte. So when an endpoint is released with its first regions, its QP destroyed and
// nothing else registered in its PD, the PD and the two regions go, as a shell, into
// a small pool on the device, and the next PrepareContext with the same sizes takes
// them instead of allocating.
//
// A shell keeps the isolation of a PD per connection ("Isolation" in the package
// docs): its PD holds no QP while pooled, and one endpoint at a time creates its QP in
// it. What stays charged: a pooled shell's regions are still registered (pinned, on a
// provider that pins), so they stay counted against Options.MaxRegisteredMemory and
// RLIMIT_MEMLOCK (budget.go's registered); Options.Budget's charge belongs to the
// connection and is refunded at release, and charged again to the connection that
// reuses the shell. A pool must never refuse a connection that would be admitted
// without it: a registration refused because of those counts first closes pooled
// shells (evictShell) and tries again, and a shell is not reused by a connection whose
// MaxRegisteredMemory the device's registrations, without the other pooled shells,
// already exceed (it registers afresh, and is refused as it would be without a pool).
// The pool empties when its device closes (idle timeout, CloseIdle, Cool, a fatal
// event: closeLocked), and holds shells only while the device keeps warm.
//
// Security. A reused ring keeps its address and rkey, which the previous connection's
// peer knew; nothing else carries over. That peer's QP cannot reach the ring: the
// previous QP is destroyed before the shell is pooled, the shell's PD holds no QP until
// the next connection creates its own, and a remote write must name a region of the
// responder QP's PD and arrive on that QP. What a device checks before the rkey:
// verbs/soft, that the requester is the QP the responder was connected to (device, QP
// number, GID) and sends the expected PSN (qp_recv.go); rdma_rxe, the packet's
// addresses against the QP's path, and its PSN; hardware RoCE, only the destination QP
// number and the PSN ("Security" in rsock's docs). The previous peer's QP is connected to
// a QP number that no longer exists or, if the device reuses it, whose new QP expects
// a random 24-bit PSN (setup.go) and, on soft and rxe, another peer. So what the pool
// changes is only that the previous peer knows the reused ring's rkey without reading
// the new proof: it helps only a host that can already forge packets with the new QP
// number and PSN, which can inject writes with or without the rkey's knowledge on a
// plaintext "rdma" connection (the proof that carries the rkey crosses the fabric in
// plaintext, and devices' rkeys are guessable: mlx5 varies their low 8 bits), and
// whose writes fail the connection over "rdma+tls". None of this holds where the peer
// reaches a region other than through a QP (verbs/shm maps it into the peer's process):
// such providers pool nothing (qpIsolator). What the previous connection left
// in the memory is cleared before the shell is reused (takeShell).

// qpIsolator is implemented by providers on which a peer reaches a registered region
// only through a QP of the region's PD, checked by the device on every access
// (verbs/soft, verbs/ibv): once the PD holds no QP, no peer reaches the region, and it
// may serve another connection. Other providers pool nothing: verbs/shm hands a
// region's memory itself to the peer's process, which may keep its mapping after the
// connection and write into it at will.
type qpIsolator interface{ IsolatesRegionsByQP() bool }

// isolatesByQP reports whether the endpoint's provider is a qpIsolator that says so.
func (ep *Endpoint) isolatesByQP() bool {
	p, _ := ep.dev.key.provider.(qpIsolator)
	return p != nil && p.IsolatesRegionsByQP()
}

// maxPooledShells bounds the shells a device keeps: enough to carry a burst of
// sequential or a few concurrent short connections (each takes one for its life),
// small enough that a pool holds at most 16 × (first ring + mailbox + first staging
// buffer) registered, 200 KiB with the defaults, while idle.
const maxPooledShells = 16

// shellKey is what must match for a shell to be reused: the sizes of the first ring
// (with its mailbox) and of the first staging buffer. Their access is the same for
// every endpoint (ringAccess, and local write), so it is not part of the key.
type shellKey struct {
	ring, send int
}

// shell is a pooled endpoint's protection domain and first regions, with their counts
// against MaxRegisteredMemory and RLIMIT_MEMLOCK, which it keeps while pooled.
type shell struct {
	key                    shellKey
	pd                     verbs.PD
	ring, send             verbs.MR
	ringCharge, sendCharge regCharge
}

// close deregisters the shell's regions, gives their counts back and frees its PD.
func (s *shell) close() error {
	errRing, errSend := s.ring.Close(), s.send.Close()
	s.ringCharge.uncharge()
	s.sendCharge.uncharge()
	errPD := s.pd.Close()
	return errors.Join(errRing, errSend, errPD)
}

// keyFor is the shell an endpoint with opts is prepared from.
func keyFor(opts Options) shellKey {
	return shellKey{ring: opts.RingSize + mailboxSize, send: opts.firstSendBuffer()}
}

// takeShell gives the endpoint a pooled shell of its sizes, if the device has one: its
// PD, ring and send buffer, cleared and charged to Options.Budget as registering them
// would charge them. It reports false, with a nil error, when there is none (the caller
// allocates afresh); an error is Options.Budget's refusal, worded as registerCounted's.
func (ep *Endpoint) takeShell() (bool, error) {
	key := keyFor(ep.opts)
	devices.Lock()
	s, ok := ep.dev.popShellLocked(key)
	if ok && ep.opts.MaxRegisteredMemory > 0 && ep.dev.usedBeyondPoolLocked() > ep.opts.MaxRegisteredMemory {
		// Without a pool, this connection's registrations would be refused: let it
		// register and be refused, rather than admit it on memory already counted.
		devices.Unlock()
		_ = s.close() // it held memory only; a failure to free it leaves nobody to tell
		return false, nil
	}
	devices.Unlock()
	if !ok {
		return false, nil
	}
	if err := ep.charge(0, key.ring); err != nil {
		ep.dev.putShell(s)
		return false, fmt.Errorf("register %d-byte receive ring: %w", key.ring, err)
	}
	if err := ep.charge(0, key.send); err != nil {
		ep.refund(0, key.ring)
		ep.dev.putShell(s)
		return false, fmt.Errorf("register %d-byte send buffer: %w", key.send, err)
	}
	// The previous connection's bytes: its peer's data in the ring, which a new
	// connection reads only where its own peer wrote, but which must not be there to be
	// handed out by mistake; its proof in the mailbox, where a shorter proof of the new
	// peer would leave the end of the old one (conn_proof.go); a resize payload at
	// mailboxIn and mailboxOut; and its own written data in the staging buffer.
	clear(s.ring.Bytes())
	clear(s.send.Bytes())
	ep.pd = s.pd
	ep.firstRing = countedMR{MR: s.ring, charge: s.ringCharge, ep: ep, budget: key.ring}
	ep.firstSend = countedMR{MR: s.send, charge: s.sendCharge, ep: ep, budget: key.send}
	ep.ring, ep.sendBuf = &ep.firstRing, &ep.firstSend
	return true, nil
}

// poolShell pools the endpoint's PD and first regions, if they can be reused; then the
// endpoint holds none of them, and their
// Options.Budget charge is left for release to refund. The endpoint's QP must be
// destroyed already. They can be reused when the ring and the staging buffer are still
// the first ones (conn_resize.go replaced neither), no other region is registered in
// the PD (a ring announced or replaced, a direct write's buffer that failed to
// deregister: ep.dirty), the provider keeps regions behind their PD's QPs
// (qpIsolator), the device keeps warm and its pool has room. (No Read or ReadFrom is
// in the ring or the staging buffer any more: a Close leaves the release to them,
// teardown.)
func (ep *Endpoint) poolShell() {
	if ep.dev == nil || ep.pd == nil || ep.qp != nil || ep.dirty ||
		ep.ring != verbs.MR(&ep.firstRing) || ep.sendBuf != verbs.MR(&ep.firstSend) ||
		ep.oldRing != nil || ep.nextRing != nil || ep.oldSend != nil || !ep.isolatesByQP() {
		return
	}
	s := shell{
		key: keyFor(ep.opts), pd: ep.pd,
		ring: ep.firstRing.MR, ringCharge: ep.firstRing.charge,
		send: ep.firstSend.MR, sendCharge: ep.firstSend.charge,
	}
	if ep.dev.keepShell(s) {
		ep.firstRing, ep.firstSend = countedMR{}, countedMR{}
		ep.ring, ep.sendBuf, ep.pd = nil, nil, nil
	}
}

// taintPD marks the endpoint's PD as holding a region that failed to deregister: its
// shell is not pooled (poolShell).
func (c *Conn) taintPD() {
	if c.ep != nil {
		c.ep.dirty = true
	}
}

// popShellLocked takes a shell of key out of the pool; devices is locked. The newest
// first: its memory is the likeliest to be in cache.
func (d *device) popShellLocked(key shellKey) (shell, bool) {
	for i := len(d.shells) - 1; i >= 0; i-- {
		if d.shells[i].key == key {
			s := d.shells[i]
			d.shells = slices.Delete(d.shells, i, i+1) // which clears the vacated slot
			return s, true
		}
	}
	return shell{}, false
}

// keepShell pools s if the device keeps warm and its pool has room, and reports
// whether it did.
func (d *device) keepShell(s shell) bool {
	devices.Lock()
	defer devices.Unlock()
	if !d.keepsWarm() || len(d.shells) >= maxPooledShells {
		return false
	}
	d.shells = append(d.shells, s)
	return true
}

// putShell gives back a shell takeShell took but could not use, or closes it if the
// pool cannot take it now.
func (d *device) putShell(s shell) {
	if !d.keepShell(s) {
		_ = s.close() // nobody is left to be told; the connection fails for its budget
	}
}

// usedBeyondPoolLocked is the device's registered bytes that are not in pooled shells:
// what would be counted on it without a pool; devices is locked.
func (d *device) usedBeyondPoolLocked() int64 {
	var pooled int64
	for i := range d.shells {
		pooled += d.shells[i].ringCharge.bytes + d.shells[i].sendCharge.bytes
	}
	registered.Lock()
	used := registered.byDevice[d]
	registered.Unlock()
	return used - pooled
}

// closeShellsLocked empties the device's pool, as the device closes; devices is locked.
func (d *device) closeShellsLocked() error {
	var errs []error
	for i := range d.shells {
		errs = append(errs, d.shells[i].close())
	}
	d.shells = slices.Delete(d.shells, 0, len(d.shells))
	return errors.Join(errs...)
}

// evictShell closes one pooled shell, of device d or, if anywhere, of any device
// (RLIMIT_MEMLOCK counts every device's pinned memory), and reports whether there was
// one: a registration refused for memory that pooled shells hold tries again.
func evictShell(d *device, anywhere bool) bool {
	devices.Lock()
	victim := d
	if len(d.shells) == 0 {
		victim = nil
		if anywhere {
			for _, o := range devices.open {
				if len(o.shells) > 0 {
					victim = o
					break
				}
			}
		}
	}
	if victim == nil {
		devices.Unlock()
		return false
	}
	s := victim.shells[0] // the oldest
	victim.shells = slices.Delete(victim.shells, 0, 1)
	devices.Unlock()
	_ = s.close() // it held memory only; a failure to free it leaves nobody to tell
	return true
}

// evictsFor reports whether a registration that failed with err may succeed once a
// pooled shell is closed, and whether the shell may be any device's: a device's budget
// counts its own registrations, RLIMIT_MEMLOCK (and the kernel's ENOMEM, which it
// causes) every device's.
func evictsFor(err error) (evict, anywhere bool) {
	switch {
	case errors.Is(err, ErrMemoryBudget):
		return true, false
	case errors.Is(err, ErrMemlock), errors.Is(err, syscall.ENOMEM):
		return true, true
	}
	return false, false
}
