package rdma

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// completionHandler is what a poller dispatches to: one per QP, found by QPN.
// Handlers run on the poller's goroutine; they must not block.
type completionHandler interface {
	// onCompletion handles one completion of this handler's QP, send or receive.
	onCompletion(wc *verbs.WorkCompletion)
	// onCQError tells the handler its CQ failed (overflow): its QP is unusable.
	onCQError(err error)
}

// completionQueue is what a poller needs of its CQ: a verbs.CQ is one, and
// poller_test.go drives a poller with a fake.
type completionQueue interface {
	Poll(wcs []verbs.WorkCompletion) (int, error)
	ReqNotify(solicitedOnly bool) error
	Close() error
}

// completionEvents is what a poller needs of its completion channel: a
// verbs.CompChannel is one.
type completionEvents interface {
	Wait(ctx context.Context) (verbs.CQ, error)
	Close() error
}

// pollBatch is how many completions one Poll call reaps.
const pollBatch = 64

// poller reaps one CQ shared by many connections. It busy-polls for a bounded number of
// empty polls, yielding the processor between them, then arms the CQ, polls once more
// (a completion may have landed between the last poll and the arming) and sleeps on the
// completion channel, which parks only this goroutine.
//
// The goroutine runs only while at least one QP is attached: the first attach starts it
// and the last detach stops it, so an idle process holds no poller goroutines. Reads and
// Writes that wait poll the CQ too (pollFor, conn_poll.go); the token (tok) keeps one
// poller at a time, so completions are dispatched in order whoever reaps them.
type poller struct {
	cq       completionQueue  // what the goroutine polls and arms
	ch       completionEvents // where it sleeps
	qpCQ     verbs.CQ         // the same CQ as the provider's object, for QPs created on it
	spin     int              // empty polls before sleeping
	yielder  pollYielder      // cq's, if its empty polls may yield the processor (poller_yield.go)
	driver   pollDriver       // cq's, if its polls may drain what feeds it (poller_yield.go)
	outside  bool             // cq is filled outside the process (poller_yield.go)
	onHost   bool             // cq is filled by this host's cores: Soft-RoCE (poller_yield.go)
	sched    threadYielder    // how pause yields; nil: the runtime's (poller_yield.go)
	capacity int              // CQ entries; attach refuses QPs whose queues would not fit

	mu       sync.RWMutex
	handlers map[uint32]completionHandler
	err      error   // sticky CQ failure
	stop     stopCtx // the goroutine's context, nil while it is not running
	done     chan struct{}

	// tok is the CQ's ownership token: whoever holds it polls the CQ and dispatches
	// what it reaps, so completions reach their handlers one at a time and in CQ order
	// (flowctl requires arrivals in order). The goroutine takes it for each poll; a Read
	// or Write that waits for its connection's completions takes it when it is free
	// (pollFor) instead of waiting for the goroutine to hand them over. wcs belongs to
	// the holder. Lock order: tok, then mu, then resMu.
	tok sync.Mutex
	wcs [pollBatch]verbs.WorkCompletion

	// resMu guards reserved, the CQ entries promised to attached QPs. It is a lock of
	// its own so that a handler, which runs with mu read-locked, can reserve more for
	// its QP (reserveMore).
	resMu    sync.Mutex
	reserved int

	// Progress, for a connection deciding whether a completion it expects could still be
	// in the CQ (see caughtUpSince): emptied counts the polls that found the CQ empty,
	// and asleep is set while the goroutine waits for an event.
	emptied atomic.Uint64
	asleep  atomic.Bool

	// Waiters spinning on the CQ (conn_poll.go), and how many may at once.
	spinners    atomic.Int32
	maxSpinners int32

	// While waiters spin, the goroutine stands by (standby set) until the last one
	// leaves and nudges it (endSpin): see run.
	standby atomic.Bool
	nudge   chan struct{} // cap 1

	// The last spinner to leave defers its nudge while nobody is parked (nudge.go):
	// owed until a new spinner takes the polling over, a waiter parks, or late pays
	// it. parked counts the waiters parked on what this poller's dispatch signals
	// (Conn.parking); deferrals counts deferred nudges, lateMark their count when late
	// was armed or last looked, and lateArmed is set while late runs.
	owed      atomic.Bool
	parked    atomic.Int32
	deferrals atomic.Uint64
	lateMark  atomic.Uint64
	lateArmed atomic.Bool
	late      *time.Timer
}

// caughtUpSince reports whether the poller has seen its CQ empty after the moment its
// emptied count was mark, or is asleep with nothing to reap: then every completion that
// was in the CQ at that moment has been dispatched. A poller that is behind on a busy
// CQ (or a loaded machine) has not, and a completion may still be waiting in the CQ.
func (p *poller) caughtUpSince(mark uint64) bool {
	return p.asleep.Load() || p.emptied.Load() != mark
}

// newPoller creates a CQ of capacity entries on completion vector vector, with a
// completion channel of its own, and the poller that reaps it.
func newPoller(ctx verbs.Context, capacity, spin, vector int) (*poller, error) {
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		return nil, fmt.Errorf("create completion channel: %w", err)
	}
	cq, err := ctx.CreateCQ(capacity, ch, vector)
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("create CQ of %d entries on completion vector %d: %w", capacity, vector, err)
	}
	p := &poller{cq: cq, ch: ch, qpCQ: cq, spin: spin, yielder: cqYielder(cq), driver: cqDriver(cq), outside: filledOutside(cq), onHost: filledOnHost(cq), capacity: capacity, handlers: make(map[uint32]completionHandler),
		maxSpinners: int32(runtime.GOMAXPROCS(0))}
	p.initNudge()
	return p, nil
}

// reserve claims entries CQ entries for a QP about to be created on this CQ. It fails
// when the CQ could overflow with them.
func (p *poller) reserve(entries int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err == nil && p.reserveMore(entries)
}

// reserveMore claims entries more CQ entries for an attached QP whose queue grows
// (conn_wqes.go). It fails when the CQ could overflow with them. Unlike reserve it does
// not take mu, so a completion handler may call it.
func (p *poller) reserveMore(entries int) bool {
	p.resMu.Lock()
	defer p.resMu.Unlock()
	if p.reserved+entries > p.capacity {
		return false
	}
	p.reserved += entries
	return true
}

// unreserve returns entries claimed by reserve and reserveMore.
func (p *poller) unreserve(entries int) {
	p.resMu.Lock()
	p.reserved -= entries
	p.resMu.Unlock()
}

// attach routes completions of QP qpn to h, starting the goroutine if needed.
//
// A goroutine that the last detach stopped may still be on its way out (detach waits
// for it without holding mu): the new one starts only once it has returned, so that
// two never run at once. Each sets and clears the poller's standby and asleep flags;
// the old one's clearing, after the new one set standby, hid the new one's standby
// from the spinners that must nudge it, and it stood by, reaping nothing, until another
// waiter polled or its connections closed: a parked Read waited for data that had
// arrived (on shm, a path proof waited out its 5 s about once in 20,000 setups one
// after the other).
func (p *poller) attach(qpn uint32, h completionHandler) error {
	p.mu.Lock()
	for p.stop == nil && p.done != nil && !isClosed(p.done) {
		exiting := p.done
		p.mu.Unlock()
		<-exiting
		p.mu.Lock()
	}
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	p.handlers[qpn] = h
	if p.stop == nil {
		p.stop, p.done = newStopCtx(), make(chan struct{})
		go p.run(p.stop, p.done)
	}
	return nil
}

// detach stops routing completions of qpn. When it was the last QP, it stops the
// goroutine and waits for it, so that no goroutine outlives the connections. It must
// not be called from the poller's goroutine.
func (p *poller) detach(qpn uint32) {
	p.mu.Lock()
	delete(p.handlers, qpn)
	var done chan struct{}
	if len(p.handlers) == 0 && p.stop != nil {
		close(p.stop)
		p.stop = nil
		done = p.done
		p.stopNudge() // nobody to nudge
	}
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// handlerList returns the handlers attached now.
func (p *poller) handlerList() []completionHandler {
	p.mu.RLock()
	defer p.mu.RUnlock()
	hs := make([]completionHandler, 0, len(p.handlers))
	for _, h := range p.handlers {
		hs = append(hs, h)
	}
	return hs
}

// close destroys the CQ and channel. The poller must be idle.
func (p *poller) close() error {
	p.late.Stop()
	return errors.Join(p.cq.Close(), p.ch.Close())
}

func (p *poller) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	empty := 0
	for ctx.Err() == nil {
		// While a waiting Read or Write holds the token, it polls for everyone: the
		// goroutine counts that as an empty poll rather than queue behind it.
		n, err := p.reap(false)
		if err != nil {
			p.fail(err)
			return
		}
		if n > 0 {
			empty = 0
			continue
		}
		if p.spinners.Load() > 0 && p.standBy(ctx) {
			empty = 0
			continue
		}
		if empty < p.spin && !p.spinFutile() {
			empty++
			p.pause(empty)
			continue
		}
		if err := p.cq.ReqNotify(false); err != nil {
			p.fail(fmt.Errorf("arm CQ: %w", err))
			return
		}
		// A completion that arrived before the arming raised no event: look again.
		if n, err = p.reap(true); err != nil {
			p.fail(err)
			return
		}
		if n > 0 {
			empty = 0
			continue
		}
		p.asleep.Store(true)
		_, err = p.ch.Wait(ctx)
		p.asleep.Store(false)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.fail(fmt.Errorf("wait for completion event: %w", err))
			return
		}
		empty = 0
	}
}

// standBy parks the goroutine while waiters spin on the CQ, and reports whether it did.
// Their polls reap and dispatch for every connection, as the goroutine's would: its
// own polls meanwhile would only contend with theirs for the token, the CQ and the
// processors, which on soft puts about a tenth on a small round trip. Nor does it arm
// the CQ and sleep, which would make the next completion raise an event and wake it
// for nothing. The last waiter to stop spinning nudges it (endSpin); a waiter that
// stops before the goroutine stands by is seen by the second look at spinners, since
// standby is set before it (and endSpin decrements before it looks at standby).
func (p *poller) standBy(ctx context.Context) bool {
	p.standby.Store(true)
	defer p.standby.Store(false)
	if p.spinners.Load() == 0 {
		return false
	}
	select {
	case <-p.nudge:
	case <-ctx.Done():
	}
	return true
}

// reap takes the token, polls one batch and dispatches it: the goroutine's poll. An
// empty poll counts in emptied (see caughtUpSince). Without wait, it returns 0 at once
// when the token is taken.
func (p *poller) reap(wait bool) (int, error) {
	if wait {
		p.tok.Lock()
	} else if !p.tok.TryLock() {
		return 0, nil
	}
	defer p.tok.Unlock()
	n, err := p.cq.Poll(p.wcs[:])
	if err != nil || n == 0 {
		if err == nil {
			p.emptied.Add(1)
		}
		return 0, err
	}
	p.mu.RLock()
	p.dispatchLocked(n)
	p.mu.RUnlock()
	return n, nil
}

// pollFor is the poll of a Read or Write that waits on QP qpn, attached with handler h:
// when the token is free and h is still attached, it polls one batch and dispatches it
// to whichever connections own the completions, exactly as the goroutine would. It
// returns how many completions it reaped, or -1 when it did not poll (the token was
// taken: someone else is polling; or h is detached, when the CQ may be going away).
// It never blocks.
//
// mu stays read-locked across the poll, so a detach, and the CQ's destruction after
// the last one, wait for it to end.
func (p *poller) pollFor(qpn uint32, h completionHandler) int {
	if !p.tok.TryLock() {
		return -1
	}
	p.mu.RLock()
	if p.err != nil || p.handlers[qpn] != h {
		p.mu.RUnlock()
		p.tok.Unlock()
		return -1
	}
	n, err := p.cq.Poll(p.wcs[:])
	switch {
	case err != nil:
	case n == 0:
		p.emptied.Add(1)
	default:
		p.dispatchLocked(n)
	}
	p.mu.RUnlock()
	p.tok.Unlock()
	if err != nil {
		p.fail(err) // the goroutine's next poll fails the same way and stops
		return -1
	}
	return n
}

// dispatchLocked hands the first n reaped completions to their QPs' handlers. Called
// with tok held and mu read-locked.
func (p *poller) dispatchLocked(n int) {
	for i := range n {
		wc := &p.wcs[i]
		if h := p.handlers[wc.QPN]; h != nil {
			h.onCompletion(wc)
		}
	}
}

// fail records a fatal CQ error and tells every attached QP, once: a failing CQ may
// be seen by the goroutine and by a waiting Read or Write.
func (p *poller) fail(err error) {
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	p.err = fmt.Errorf("completion queue failed: %w", err)
	hs := make([]completionHandler, 0, len(p.handlers))
	for _, h := range p.handlers {
		hs = append(hs, h)
	}
	p.mu.Unlock()
	for _, h := range hs {
		h.onCQError(p.err)
	}
}
