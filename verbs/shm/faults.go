package shm

import (
	"fmt"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// Fault injection, for the tests of what runs above the provider: the methods of
// verbstest.Faults and verbstest.PortFaults. They act on this process's side only.

// Allocation kinds of [Provider.FailAllocs].
var allocKinds = [...]string{"context", "pd", "mr", "cq", "qp", "channel", "dial", "accept", "region"}

const (
	allocContext = iota
	allocPD
	allocMR
	allocCQ
	allocQP
	allocChannel
	allocDial   // a QP's connection to its destination QP's socket (dialPeer)
	allocAccept // a QP's acceptance of a requester's connection (acceptLoop)
	allocRegion // a QP's mapping of a region of its destination's (addRegion)
)

// FailAllocs makes the next n allocations of kind ("context", "pd", "mr", "cq", "qp",
// "channel", "dial": a QP's connection to its destination QP, or "accept": a QP's
// acceptance of a requester's connection, each as a process out of file descriptors
// fails to make it, or "region": a QP's mapping of a region of its destination's, as a
// process out of memory mappings fails it) fail with [verbs.ErrNoResources]. n = 0
// cancels.
func (p *Provider) FailAllocs(kind string, n int) error {
	for i, k := range allocKinds {
		if k == kind {
			p.allocFail[i].Store(int64(max(n, 0)))
			return nil
		}
	}
	return fmt.Errorf("shm: fail allocations: unknown kind %q: %w", kind, verbs.ErrInvalidArgument)
}

// injectedFailure consumes one injected failure of kind, if one is pending.
func (p *Provider) injectedFailure(kind int) error {
	c := &p.allocFail[kind]
	for {
		n := c.Load()
		if n <= 0 {
			return nil
		}
		if c.CompareAndSwap(n, n-1) {
			return fmt.Errorf("injected failure: %w", verbs.ErrNoResources)
		}
	}
}

// own returns qp as a QP of this provider.
func (p *Provider) own(qp verbs.QP) (*QP, error) {
	q, ok := qp.(*QP)
	if !ok || q.dev.p != p {
		return nil, fmt.Errorf("shm: QP of another provider: %w", verbs.ErrInvalidArgument)
	}
	return q, nil
}

// BreakQP loses every request qp sends or is sent until RepairQP.
func (p *Provider) BreakQP(qp verbs.QP) error {
	q, err := p.own(qp)
	if err == nil {
		q.broken.Store(true)
	}
	return err
}

// RepairQP undoes BreakQP; a request awaiting retransmission goes at its ACK timeout.
func (p *Provider) RepairQP(qp verbs.QP) error {
	q, err := p.own(qp)
	if err == nil {
		q.broken.Store(false)
	}
	return err
}

// DelayQP delays each request qp posts from now on by d.
func (p *Provider) DelayQP(qp verbs.QP, d time.Duration) error {
	q, err := p.own(qp)
	if err == nil {
		q.delay.Store(int64(d))
	}
	return err
}

// FailQP moves qp to ERROR as a fatal asynchronous error does, and raises EventQPFatal
// on its device's contexts.
func (p *Provider) FailQP(qp verbs.QP) error {
	q, err := p.own(qp)
	if err != nil {
		return err
	}
	q.fail()
	q.dev.broadcast(verbs.AsyncEvent{Type: verbs.EventQPFatal, QPN: q.qpn})
	return nil
}

// SetPortState sets the state of a device's port. A port that is not active loses
// every request to and from the device, and leaves QPs alone; leaving and entering the
// active state raise EventPortErr and EventPortActive.
func (p *Provider) SetPortState(device string, port uint8, state verbs.PortState) error {
	for _, d := range p.devices {
		if d.attr.Name != device {
			continue
		}
		if port != 1 {
			return fmt.Errorf("shm: set state of port %d: %w", port, verbs.ErrInvalidArgument)
		}
		was := d.portState()
		d.port.Store(int32(state))
		switch {
		case was == verbs.PortActive && state != verbs.PortActive:
			d.broadcast(verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
		case was != verbs.PortActive && state == verbs.PortActive:
			d.broadcast(verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1})
		}
		return nil
	}
	return fmt.Errorf("shm: set port state of %q: %w", device, verbs.ErrNoDevice)
}

// portState is the state of the device's port.
func (d *device) portState() verbs.PortState {
	if s := verbs.PortState(d.port.Load()); s != 0 {
		return s
	}
	return verbs.PortActive
}

// broadcast queues e on every context open on the device.
func (d *device) broadcast(e verbs.AsyncEvent) {
	d.ctxMu.Lock()
	defer d.ctxMu.Unlock()
	for c := range d.contexts {
		c.events.Push(e)
	}
}

// loses reports whether the requests q sends or is sent are lost to an injected fault.
func (q *QP) loses() bool {
	return q.broken.Load() || q.dev.portState() != verbs.PortActive
}
