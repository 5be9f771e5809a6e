package rdma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// fakeCQ is a completion queue and its channel in one, for driving a poller without a
// provider: the test pushes completions, which raise an event when the CQ is armed, as
// a device's would.
type fakeCQ struct {
	mu      sync.Mutex
	queue   []verbs.WorkCompletion
	armed   bool
	pollErr error
	arms    int
	events  chan struct{} // cap 1: an event is pending
	closed  bool
}

func newFakeCQ() *fakeCQ { return &fakeCQ{events: make(chan struct{}, 1)} }

// push queues completions and raises an event if the CQ is armed.
func (f *fakeCQ) push(wcs ...verbs.WorkCompletion) {
	f.mu.Lock()
	f.queue = append(f.queue, wcs...)
	f.raiseLocked()
	f.mu.Unlock()
}

// failWith makes the next Poll fail with err, and wakes a sleeping poller.
func (f *fakeCQ) failWith(err error) {
	f.mu.Lock()
	f.pollErr = err
	f.armed = true
	f.raiseLocked()
	f.mu.Unlock()
}

func (f *fakeCQ) raiseLocked() {
	if f.armed {
		f.armed = false
		signal(f.events)
	}
}

func (f *fakeCQ) Poll(wcs []verbs.WorkCompletion) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pollErr != nil {
		return 0, f.pollErr
	}
	n := copy(wcs, f.queue)
	f.queue = f.queue[n:]
	return n, nil
}

func (f *fakeCQ) ReqNotify(bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = true
	f.arms++
	return nil
}

func (f *fakeCQ) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// fakeEvents is the fake CQ's completion channel.
type fakeEvents struct{ cq *fakeCQ }

func (e fakeEvents) Wait(ctx context.Context) (verbs.CQ, error) {
	select {
	case <-e.cq.events:
		return nil, nil // the poller does not look at which CQ
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e fakeEvents) Close() error { return nil }

// recorder is a completionHandler that keeps what it is handed.
type recorder struct {
	mu     sync.Mutex
	wrids  []uint64
	cqErrs []error
}

func (r *recorder) onCompletion(wc *verbs.WorkCompletion) {
	r.mu.Lock()
	r.wrids = append(r.wrids, wc.WRID)
	r.mu.Unlock()
}

func (r *recorder) onCQError(err error) {
	r.mu.Lock()
	r.cqErrs = append(r.cqErrs, err)
	r.mu.Unlock()
}

func (r *recorder) got() ([]uint64, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.wrids...), append([]error(nil), r.cqErrs...)
}

func newFakePoller(cq *fakeCQ, capacity, spin int) *poller {
	p := &poller{cq: cq, ch: fakeEvents{cq}, spin: spin, capacity: capacity, handlers: make(map[uint32]completionHandler), maxSpinners: 2}
	p.initNudge()
	return p
}

// TestPollerDispatchesByQPN checks that completions reach the handler of their QP, in
// order, whether the poller is spinning or asleep on the channel; that a completion of
// a QP no longer attached is dropped; and that the last detach stops the goroutine. It
// runs in a synctest bubble, so "the poller is asleep" is decided by synctest.Wait.
func TestPollerDispatchesByQPN(t *testing.T) {
	for _, spin := range []int{0, 100} {
		t.Run(map[int]string{0: "sleeps at once", 100: "spins first"}[spin], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cq := newFakeCQ()
				p := newFakePoller(cq, 64, spin)
				a, b := &recorder{}, &recorder{}
				require.NoError(t, p.attach(1, a))
				require.NoError(t, p.attach(2, b))

				synctest.Wait() // asleep on the channel, the CQ armed
				cq.mu.Lock()
				require.True(t, cq.armed, "a sleeping poller has armed its CQ")
				cq.mu.Unlock()
				cq.push(verbs.WorkCompletion{WRID: 10, QPN: 1}, verbs.WorkCompletion{WRID: 20, QPN: 2},
					verbs.WorkCompletion{WRID: 11, QPN: 1}, verbs.WorkCompletion{WRID: 99, QPN: 7})
				synctest.Wait()
				wa, _ := a.got()
				wb, _ := b.got()
				require.Equal(t, []uint64{10, 11}, wa)
				require.Equal(t, []uint64{20}, wb)

				p.detach(2)
				cq.push(verbs.WorkCompletion{WRID: 21, QPN: 2}, verbs.WorkCompletion{WRID: 12, QPN: 1})
				synctest.Wait()
				wa, _ = a.got()
				wb, _ = b.got()
				require.Equal(t, []uint64{10, 11, 12}, wa)
				require.Equal(t, []uint64{20}, wb, "detached: nothing more")

				p.detach(1) // the last: returns once the goroutine has exited
				require.NoError(t, p.close())
			})
		})
	}
}

// TestPollerCQFailure checks that a failing CQ tells every attached handler, once,
// stops the goroutine, and refuses later attaches and reservations.
func TestPollerCQFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ()
		p := newFakePoller(cq, 64, 0)
		require.True(t, p.reserve(32))
		a, b := &recorder{}, &recorder{}
		require.NoError(t, p.attach(1, a))
		require.NoError(t, p.attach(2, b))
		synctest.Wait()
		cq.failWith(verbs.ErrCQOverflow)
		synctest.Wait()
		for _, r := range []*recorder{a, b} {
			_, errs := r.got()
			require.Len(t, errs, 1)
			require.ErrorIs(t, errs[0], verbs.ErrCQOverflow)
		}
		err := p.attach(3, &recorder{})
		require.ErrorIs(t, err, verbs.ErrCQOverflow)
		require.False(t, p.reserve(1), "a failed CQ takes no more QPs")
		p.detach(1)
		p.detach(2)
		require.NoError(t, p.close())
		require.True(t, errors.Is(p.err, verbs.ErrCQOverflow))
	})
}

// TestPollerReserve checks the CQ-capacity accounting that keeps a shared CQ from
// overflowing.
func TestPollerReserve(t *testing.T) {
	p := newFakePoller(newFakeCQ(), 100, 0)
	require.True(t, p.reserve(60))
	require.False(t, p.reserve(41), "past capacity")
	require.True(t, p.reserve(40))
	p.unreserve(60)
	require.True(t, p.reserve(60))
	require.False(t, p.reserve(1))
}

// TestPollerCaughtUpSince: a poller has caught up with its CQ since a mark once a poll
// found the CQ empty after it, or while it sleeps; a poller that has reaped only full
// batches since the mark has not (a FIN may still wait in its CQ).
func TestPollerCaughtUpSince(t *testing.T) {
	var p poller
	mark := p.emptied.Load()
	require.False(t, p.caughtUpSince(mark), "no empty poll since the mark, not asleep")
	p.emptied.Add(1)
	require.True(t, p.caughtUpSince(mark), "an empty poll after the mark")
	mark = p.emptied.Load()
	p.asleep.Store(true)
	require.True(t, p.caughtUpSince(mark), "asleep: nothing left to reap")
}

// vectorProvider is a soft fabric whose contexts record the completion vector of every
// CQ created on them.
type vectorProvider struct {
	*soft.Fabric
	mu      sync.Mutex
	vectors []int
}

func (p *vectorProvider) Open(name string) (verbs.Context, error) {
	c, err := p.Fabric.Open(name)
	if err != nil {
		return nil, err
	}
	return &vectorContext{Context: c, p: p}, nil
}

type vectorContext struct {
	verbs.Context
	p *vectorProvider
}

func (c *vectorContext) CreateCQ(cqe int, ch verbs.CompChannel, vector int) (verbs.CQ, error) {
	c.p.mu.Lock()
	c.p.vectors = append(c.p.vectors, vector)
	c.p.mu.Unlock()
	return c.Context.CreateCQ(cqe, ch, vector)
}

// TestPollersSpreadOverVectors makes every connection need a CQ of its own: the CQs
// are created on the device's completion vectors in turn, wrapping around.
func TestPollersSpreadOverVectors(t *testing.T) {
	p := &vectorProvider{Fabric: soft.New(soft.Options{})}
	devs, err := p.Devices()
	require.NoError(t, err)
	n := devs[0].NumCompVectors
	require.Greater(t, n, 1, "soft reports several completion vectors")
	opts := Options{RingSize: MinRingSize, SendBufferSize: 1024, SendWQEs: 8, RecvWQEs: 8, CQSize: 16}
	var eps []*Endpoint
	for range n + 2 {
		ep, err := Prepare(p, loopback, opts)
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	want := make([]int, n+2)
	for i := range want {
		want[i] = i % n
	}
	require.Equal(t, want, p.vectors, "completion vectors of the CQs, in creation order")
	for _, ep := range eps {
		require.NoError(t, ep.Abort())
	}
	requireReleased(t, p.Fabric)
}

// TestPollerStandsByWhileWaitersSpin: while a waiter holds a spinning slot, the
// goroutine neither polls the CQ nor arms it (the waiter's polls serve everyone), and
// the waiter that gives the last slot back nudges it into polling again, nudgeGrace
// later with nobody parked (nudge_test.go has the rest of that).
func TestPollerStandsByWhileWaitersSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ()
		p := newFakePoller(cq, 64, 100)
		a := &recorder{}
		require.NoError(t, p.attach(1, a))
		synctest.Wait() // asleep on the channel, the CQ armed
		waiter := &Conn{poll: p}
		require.Equal(t, 100, waiter.beginSpin(false), "polls granted to the waiter")

		cq.push(verbs.WorkCompletion{WRID: 1, QPN: 1}) // wakes the goroutine
		synctest.Wait()
		require.True(t, p.standby.Load(), "the goroutine stands by while a waiter spins")
		cq.mu.Lock()
		arms := cq.arms
		cq.mu.Unlock()
		cq.push(verbs.WorkCompletion{WRID: 2, QPN: 1})
		synctest.Wait()
		wa, _ := a.got()
		require.Equal(t, []uint64{1}, wa, "dispatched while standing by")
		cq.mu.Lock()
		require.Len(t, cq.queue, 1, "completions left for the spinning waiter")
		require.Equal(t, arms, cq.arms, "arms while standing by")
		cq.mu.Unlock()

		p.endSpin() // the last slot: the goroutine takes over, once the grace is over
		time.Sleep(nudgeGrace)
		synctest.Wait()
		wa, _ = a.got()
		require.Equal(t, []uint64{1, 2}, wa, "dispatched once the waiter stopped spinning")
		require.False(t, p.standby.Load(), "standing by with no waiter spinning")

		p.detach(1)
		require.NoError(t, p.close())
	})
}

// TestAttachWaitsForTheStoppedGoroutine: the goroutine that the last detach stopped
// may still be running when the next QP attaches (detach waits for it without the
// lock). The new goroutine starts only once the old one has returned: two at once
// clobbered each other's standby flag, and a goroutine standing by that spinners
// believed was not waited for a nudge nobody sent.
func TestAttachWaitsForTheStoppedGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFakePoller(newFakeCQ(), 64, 0)
		exiting := make(chan struct{})
		p.done = exiting // stopped by the last detach (p.stop is nil), not yet returned
		attached := make(chan error, 1)
		go func() { attached <- p.attach(1, &recorder{}) }()
		synctest.Wait()
		require.Empty(t, attached, "attach returned while the stopped goroutine still ran")
		p.mu.RLock()
		started := p.stop != nil
		p.mu.RUnlock()
		require.False(t, started, "a second goroutine started beside the stopped one")

		close(exiting) // the stopped goroutine returns
		require.NoError(t, <-attached)
		p.mu.RLock()
		started = p.stop != nil
		p.mu.RUnlock()
		require.True(t, started, "no goroutine started once the stopped one returned")
		p.detach(1)
	})
}

// TestPollerSleepsAtOnceWhereSpinFutile: the goroutine spins its polls before it arms
// the CQ and sleeps while the CQ's polls drive what fills it, and arms at once when
// they do not (pollDriver).
func TestPollerSleepsAtOnceWhereSpinFutile(t *testing.T) {
	for _, drives := range []bool{true, false} {
		t.Run(fmt.Sprintf("drives %v", drives), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cq := newFakeCQ()
				p := newFakePoller(cq, 64, 100)
				d := &drivingFlag{}
				d.drives.Store(drives)
				p.driver = d
				require.NoError(t, p.attach(1, &recorder{}))
				synctest.Wait() // asleep on the channel, the CQ armed
				polls := p.emptied.Load()
				if drives {
					require.Greater(t, polls, uint64(100), "empty polls before sleeping")
				} else {
					require.Equal(t, uint64(2), polls, "empty polls before sleeping: one, and one after arming")
				}
				p.detach(1)
				require.NoError(t, p.close())
			})
		})
	}
}
