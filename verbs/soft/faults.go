package soft

import (
	"fmt"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// Kinds of allocation that [Fabric.FailAllocs] can make fail.
const (
	AllocContext     = "context" // Provider.Open
	AllocPD          = "pd"      // Context.AllocPD
	AllocMR          = "mr"      // PD.RegMR
	AllocCQ          = "cq"      // Context.CreateCQ
	AllocQP          = "qp"      // PD.CreateQP
	AllocCompChannel = "channel" // Context.CreateCompChannel
)

var allocKinds = [...]string{AllocContext, AllocPD, AllocMR, AllocCQ, AllocQP, AllocCompChannel}

const numAllocKinds = len(allocKinds)

// linkFault is the injected state of the link between two devices.
type linkFault struct {
	broken bool
	delay  time.Duration
}

// FailAllocs makes the next n allocations of kind (one of the Alloc constants) fail with
// [verbs.ErrNoResources], as a device out of memory or handles would. n = 0 cancels.
func (f *Fabric) FailAllocs(kind string, n int) error {
	for i, k := range allocKinds {
		if k == kind {
			f.allocFail[i].Store(int64(max(n, 0)))
			return nil
		}
	}
	return fmt.Errorf("soft: fail allocations: unknown kind %q: %w", kind, verbs.ErrInvalidArgument)
}

// injectedFailure consumes one injected failure of kind, if any is pending.
func (f *Fabric) injectedFailure(kind string) error {
	for i, k := range allocKinds {
		if k != kind {
			continue
		}
		for {
			n := f.allocFail[i].Load()
			if n <= 0 {
				return nil
			}
			if f.allocFail[i].CompareAndSwap(n, n-1) {
				return fmt.Errorf("injected %s allocation failure: %w", kind, verbs.ErrNoResources)
			}
		}
	}
	return nil
}

// qpOf returns qp as a QP of this fabric.
func (f *Fabric) qpOf(op string, qp verbs.QP) (*QP, error) {
	q, ok := qp.(*QP)
	if !ok || q == nil || q.dev.fab != f {
		return nil, fmt.Errorf("soft: %s: not a QP of this fabric: %w", op, verbs.ErrInvalidArgument)
	}
	return q, nil
}

// BreakQP loses every request qp sends and every request sent to it, until RepairQP. A
// requester whose request is lost retransmits after its ACK timeout and, when its retry
// count is spent, completes the request with RETRY_EXC_ERR and moves to ERROR. Requests
// already waiting for a retransmission are retransmitted after a repair.
func (f *Fabric) BreakQP(qp verbs.QP) error {
	q, err := f.qpOf("break QP", qp)
	if err != nil {
		return err
	}
	f.faultsUsed.Store(true)
	q.broken.Store(true)
	return nil
}

// RepairQP undoes BreakQP.
func (f *Fabric) RepairQP(qp verbs.QP) error {
	q, err := f.qpOf("repair QP", qp)
	if err != nil {
		return err
	}
	q.broken.Store(false)
	return nil
}

// DelayQP delays the delivery of each request qp posts from now on by d (0 ends the
// delay). Delayed requests keep their order, and requests posted behind them wait for
// them.
func (f *Fabric) DelayQP(qp verbs.QP, d time.Duration) error {
	q, err := f.qpOf("delay QP", qp)
	if err != nil {
		return err
	}
	f.faultsUsed.Store(true)
	q.delay.Store(int64(max(d, 0)))
	return nil
}

// FailQP moves qp to ERROR as a fatal asynchronous error (IBV_EVENT_QP_FATAL) does. The
// state changes before FailQP returns; the outstanding WRs are flushed with WR_FLUSH_ERR
// shortly after, from another goroutine.
func (f *Fabric) FailQP(qp verbs.QP) error {
	q, err := f.qpOf("fail QP", qp)
	if err != nil {
		return err
	}
	if q.State() != verbs.QPStateError && !q.closed.Load() {
		q.dev.events.broadcast(verbs.AsyncEvent{Type: verbs.EventQPFatal, QPN: q.qpn})
	}
	q.fail()
	return nil
}

// FailDevice moves every QP of the named device to ERROR, as FailQP does, like a device
// that hit a fatal error, and raises EventDeviceFatal on every context open on it.
func (f *Fabric) FailDevice(name string) error {
	d, ok := f.byName[name]
	if !ok {
		return fmt.Errorf("soft: fail device %q: %w", name, verbs.ErrNoDevice)
	}
	d.events.broadcast(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	d.qpMu.RLock()
	qps := make([]*QP, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.qpMu.RUnlock()
	for _, q := range qps {
		q.fail()
	}
	return nil
}

// BreakLink loses every request between the named devices, in both directions, until
// RepairLink, with the consequences BreakQP describes. a and b may name the same device.
func (f *Fabric) BreakLink(a, b string) error {
	return f.setLink("break link", a, b, func(l *linkFault) { l.broken = true })
}

// RepairLink undoes BreakLink.
func (f *Fabric) RepairLink(a, b string) error {
	return f.setLink("repair link", a, b, func(l *linkFault) { l.broken = false })
}

// DelayLink delays the delivery of each request posted from now on between the named
// devices by d, as DelayQP does. 0 ends the delay.
func (f *Fabric) DelayLink(a, b string, d time.Duration) error {
	return f.setLink("delay link", a, b, func(l *linkFault) { l.delay = max(d, 0) })
}

func (f *Fabric) setLink(op, a, b string, change func(*linkFault)) error {
	da, ok1 := f.byName[a]
	db, ok2 := f.byName[b]
	if !ok1 || !ok2 {
		return fmt.Errorf("soft: %s %q-%q: %w", op, a, b, verbs.ErrNoDevice)
	}
	f.faultsUsed.Store(true)
	key := linkKey(da, db)
	f.linkMu.Lock()
	l := f.links[key]
	change(&l)
	if l == (linkFault{}) {
		delete(f.links, key)
	} else {
		f.links[key] = l
	}
	f.linkMu.Unlock()
	return nil
}

func linkKey(a, b *device) [2]int {
	if a.index > b.index {
		a, b = b, a
	}
	return [2]int{a.index, b.index}
}

// link returns the injected state of the link between a and b; b may be nil.
func (f *Fabric) link(a, b *device) linkFault {
	if b == nil || !f.faultsUsed.Load() {
		return linkFault{}
	}
	f.linkMu.RLock()
	l := f.links[linkKey(a, b)]
	f.linkMu.RUnlock()
	if a.events.down.Load() || b.events.down.Load() { // SetPortState: a port is down
		l.broken = true
	}
	return l
}
