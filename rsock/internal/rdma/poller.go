package rdma

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

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
// and the last detach stops it, so an idle process holds no poller goroutines.
type poller struct {
	cq       completionQueue  // what the goroutine polls and arms
	ch       completionEvents // where it sleeps
	qpCQ     verbs.CQ         // the same CQ as the provider's object, for QPs created on it
	spin     int              // empty polls before sleeping
	capacity int              // CQ entries; attach refuses QPs whose queues would not fit

	mu       sync.RWMutex
	handlers map[uint32]completionHandler
	reserved int   // CQ entries promised to attached QPs
	err      error // sticky CQ failure
	cancel   context.CancelFunc
	done     chan struct{}

	wcs [pollBatch]verbs.WorkCompletion // owned by the goroutine

	// Progress, for a connection deciding whether a completion it expects could still be
	// in the CQ (see caughtUpSince): emptied counts the polls that found the CQ empty,
	// and asleep is set while the goroutine waits for an event.
	emptied atomic.Uint64
	asleep  atomic.Bool
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
	return &poller{cq: cq, ch: ch, qpCQ: cq, spin: spin, capacity: capacity, handlers: make(map[uint32]completionHandler)}, nil
}

// reserve claims entries CQ entries for a QP about to be created on this CQ. It fails
// when the CQ could overflow with them.
func (p *poller) reserve(entries int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil || p.reserved+entries > p.capacity {
		return false
	}
	p.reserved += entries
	return true
}

// unreserve returns entries claimed by reserve.
func (p *poller) unreserve(entries int) {
	p.mu.Lock()
	p.reserved -= entries
	p.mu.Unlock()
}

// attach routes completions of QP qpn to h, starting the goroutine if needed.
func (p *poller) attach(qpn uint32, h completionHandler) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	p.handlers[qpn] = h
	if p.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		p.done = make(chan struct{})
		go p.run(ctx, p.done)
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
	if len(p.handlers) == 0 && p.cancel != nil {
		p.cancel()
		p.cancel = nil
		done = p.done
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
	return errors.Join(p.cq.Close(), p.ch.Close())
}

func (p *poller) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	empty := 0
	for ctx.Err() == nil {
		n, err := p.cq.Poll(p.wcs[:])
		if err != nil {
			p.fail(err)
			return
		}
		if n > 0 {
			p.dispatch(n)
			empty = 0
			continue
		}
		p.emptied.Add(1)
		if empty < p.spin {
			empty++
			runtime.Gosched()
			continue
		}
		if err := p.cq.ReqNotify(false); err != nil {
			p.fail(fmt.Errorf("arm CQ: %w", err))
			return
		}
		// A completion that arrived before the arming raised no event: look again.
		if n, err = p.cq.Poll(p.wcs[:]); err != nil {
			p.fail(err)
			return
		}
		if n > 0 {
			p.dispatch(n)
			empty = 0
			continue
		}
		p.emptied.Add(1)
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

// dispatch hands the first n reaped completions to their QPs' handlers.
func (p *poller) dispatch(n int) {
	p.mu.RLock()
	for i := range n {
		wc := &p.wcs[i]
		if h := p.handlers[wc.QPN]; h != nil {
			h.onCompletion(wc)
		}
	}
	p.mu.RUnlock()
}

// fail records a fatal CQ error and tells every attached QP.
func (p *poller) fail(err error) {
	p.mu.Lock()
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
