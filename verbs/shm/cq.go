package shm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

var (
	errPollOverflow = fmt.Errorf("shm: poll CQ: %w", verbs.ErrCQOverflow)
	errPollClosed   = fmt.Errorf("shm: poll CQ: %w", verbs.ErrClosed)
)

// CQ is a completion queue of fixed capacity. It implements [verbs.CQ].
//
// A completion that finds the queue full is lost and the queue overflows: from then on
// Poll fails with [verbs.ErrCQOverflow], and every QP that tries to add a completion to it
// moves to ERROR, as the IBV_EVENT_CQ_ERR of a real overrun leaves its QPs.
//
// Work-queue slots are released when their completion is polled, not when it is
// generated, as on hardware whose driver advances the queue tail while polling: a QP whose
// completions sit unpolled in a CQ cannot post into those slots.
type CQ struct {
	ctx *Context
	ch  *CompChannel // nil if the CQ is only polled

	mu            sync.Mutex
	ring          []cqEntry
	head, n       int
	overflowed    bool
	closed        bool
	armed         bool
	solicitedOnly bool
	users         int // QPs using the CQ

	eventQueued bool // an event for this CQ waits in ch; guarded by ch.mu

	feedMu    sync.Mutex
	feeders   atomic.Pointer[[]*QP] // QPs whose rings Poll drains (drive.go)
	polls     atomic.Uint64         // Poll calls, for the goroutines that watch them
	armedHint atomic.Bool           // armed, readable without mu
}

// cqEntry is a completion and the work-queue slots that polling it releases.
type cqEntry struct {
	wc       verbs.WorkCompletion
	qp       *QP
	sendSlot uint32 // send-queue slots released: the WR and the unsignaled WRs before it
	recvSlot uint32 // receive-queue slots released
}

// Capacity returns how many completions the CQ holds. The conformance suite uses it to
// overflow the CQ exactly.
func (c *CQ) Capacity() int { return len(c.ring) }

// Poll moves up to len(wc) completions into wc. It allocates nothing.
//
// It first drains the rings of the QPs that feed the CQ (drive.go): a polling
// application moves their requests and responses itself.
func (c *CQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	c.polls.Add(1)
	c.drive()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, errPollClosed
	}
	if c.overflowed {
		c.mu.Unlock()
		return 0, errPollOverflow
	}
	n := min(len(wc), c.n)
	for i := range n {
		e := &c.ring[c.head]
		wc[i] = e.wc
		if e.sendSlot != 0 {
			e.qp.sqPolled.Add(uint64(e.sendSlot))
		}
		if e.recvSlot != 0 {
			e.qp.rqPolled.Add(uint64(e.recvSlot))
		}
		e.qp = nil
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.n -= n
	c.mu.Unlock()
	if n == 0 && c.polls.Load()%yieldEvery == 0 {
		yieldCPU() // drive.go
	}
	return n, nil
}

// push adds a completion for qp. solicited says whether it wakes a CQ armed for solicited
// completions only. It reports false, and marks the CQ overflowed, if the CQ was full; the
// caller then moves qp to ERROR.
func (c *CQ) push(wc *verbs.WorkCompletion, qp *QP, sendSlot, recvSlot uint32, solicited bool) bool {
	c.mu.Lock()
	if c.closed || c.overflowed {
		c.mu.Unlock()
		return false
	}
	if c.n == len(c.ring) {
		c.overflowed = true
		c.mu.Unlock()
		return false
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = cqEntry{wc: *wc, qp: qp, sendSlot: sendSlot, recvSlot: recvSlot}
	c.n++
	if c.armed && (!c.solicitedOnly || solicited || wc.Status != verbs.WCSuccess) {
		c.armed = false
		c.armedHint.Store(false)
		if c.ch != nil {
			c.ch.notify(c)
		}
	}
	c.mu.Unlock()
	return true
}

// forget removes the completions of qp, as destroying or resetting a QP cleans its
// completions from its CQs.
func (c *CQ) forget(qp *QP) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := 0
	for k := range c.n {
		e := c.ring[(c.head+k)%len(c.ring)]
		if e.qp == qp {
			continue
		}
		c.ring[(c.head+kept)%len(c.ring)] = e
		kept++
	}
	for k := kept; k < c.n; k++ {
		c.ring[(c.head+k)%len(c.ring)] = cqEntry{}
	}
	c.n = kept
}

// use records that a QP uses the CQ.
func (c *CQ) use() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return verbs.ErrClosed
	}
	c.users++
	return nil
}

func (c *CQ) unuse() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
}

// ReqNotify arms the CQ: the next completion added to it (with solicitedOnly, the next
// solicited or failed one) produces one event on its channel. Completions already in the
// CQ produce none, so poll once more after arming.
//
// Arming also tells the peers that feed the CQ through rings to ring their doorbells:
// no one polls them now (drive.go).
func (c *CQ) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return fmt.Errorf("shm: arm CQ: %w", verbs.ErrClosed)
	case c.overflowed:
		c.mu.Unlock()
		return fmt.Errorf("shm: arm CQ: %w", verbs.ErrCQOverflow)
	}
	if !c.armed {
		c.armed, c.solicitedOnly = true, solicitedOnly
	} else if !solicitedOnly {
		c.solicitedOnly = false
	}
	c.armedHint.Store(true)
	c.mu.Unlock()
	c.announceSleep()
	return nil
}

// Close destroys the CQ. QPs using it must be closed first.
func (c *CQ) Close() error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return fmt.Errorf("shm: destroy CQ: %w", verbs.ErrClosed)
	case c.users > 0:
		c.mu.Unlock()
		return fmt.Errorf("shm: destroy CQ used by %d QPs: %w", c.users, verbs.ErrBusy)
	}
	c.closed = true
	clear(c.ring)
	c.n = 0
	c.mu.Unlock()
	if c.ch != nil {
		c.ch.drop(c)
		c.ch.refs.release()
	}
	c.ctx.refs.release()
	c.ctx.dev.nCQ.Add(-1)
	return nil
}

// CompChannel delivers events of armed CQs. It implements [verbs.CompChannel]. Events are
// coalesced per CQ: a CQ armed and triggered again before its event was taken still has a
// single event waiting, as one ibv_get_cq_event covers them.
type CompChannel struct {
	ctx  *Context
	refs refs // attached CQs

	mu      sync.Mutex
	pending []*CQ // CQs with an event, oldest first from head
	head    int
	closed  bool

	wake chan struct{} // a token when pending may be non-empty
	done chan struct{} // closed by Close
}

func newCompChannel(c *Context) *CompChannel {
	return &CompChannel{ctx: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// notify queues an event for cq. The caller holds cq.mu.
func (ch *CompChannel) notify(cq *CQ) {
	ch.mu.Lock()
	if !ch.closed && !cq.eventQueued {
		cq.eventQueued = true
		ch.pending = append(ch.pending, cq)
	}
	ch.mu.Unlock()
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

// drop discards a pending event of cq, which is being destroyed.
func (ch *CompChannel) drop(cq *CQ) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !cq.eventQueued {
		return
	}
	cq.eventQueued = false
	kept := ch.pending[:ch.head]
	for _, p := range ch.pending[ch.head:] {
		if p != cq {
			kept = append(kept, p)
		}
	}
	clear(ch.pending[len(kept):])
	ch.pending = kept
}

// Wait blocks the calling goroutine until an armed CQ of this channel gets a completion and
// returns that CQ, with its event acknowledged. It returns ctx.Err() when ctx ends first and
// an error wrapping [verbs.ErrClosed] once the channel is closed.
func (ch *CompChannel) Wait(ctx context.Context) (verbs.CQ, error) {
	for {
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return nil, fmt.Errorf("shm: wait for CQ event: %w", verbs.ErrClosed)
		}
		if ch.head < len(ch.pending) {
			cq := ch.pending[ch.head]
			ch.pending[ch.head] = nil
			ch.head++
			more := ch.head < len(ch.pending)
			if !more {
				ch.pending, ch.head = ch.pending[:0], 0
			}
			cq.eventQueued = false
			ch.mu.Unlock()
			if more { // another waiter may be parked on the token this call consumed
				select {
				case ch.wake <- struct{}{}:
				default:
				}
			}
			return cq, nil
		}
		ch.mu.Unlock()
		select {
		case <-ch.wake:
		case <-ch.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close closes the channel and wakes every Wait. CQs attached to it must be closed first.
func (ch *CompChannel) Close() error {
	if err := ch.refs.close(); err != nil {
		return fmt.Errorf("shm: destroy completion channel: %w", err)
	}
	ch.mu.Lock()
	ch.closed = true
	ch.mu.Unlock()
	close(ch.done)
	ch.ctx.refs.release()

	return nil
}
