package rc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// Slots counts the work-queue slots of one QP that polled completions have released.
// A QP has one; the slots it has in use are those it posted minus those released.
type Slots struct {
	SQ atomic.Uint64 // send-queue slots released
	RQ atomic.Uint64 // receive-queue slots released
}

// CQ is the core of a completion queue of fixed capacity. A provider's CQ holds one
// (Init) and forwards [verbs.CQ]'s methods to it.
//
// A completion that finds the queue full is lost and the queue overflows: from then on
// Poll fails with [verbs.ErrCQOverflow], and Push reports false, upon which the provider
// moves the QP that pushed to ERROR, as the IBV_EVENT_CQ_ERR of a real overrun leaves its
// QPs.
//
// Work-queue slots are released when their completion is polled, not when it is
// generated, as on hardware whose driver advances the queue tail while polling: a QP whose
// completions sit unpolled in a CQ cannot post into those slots.
type CQ struct {
	p    *Provider
	self verbs.CQ // the provider's CQ, which Channel.Wait returns
	ch   *Channel // nil if the CQ is only polled

	mu            sync.Mutex
	ring          []entry
	head, n       int
	overflowed    bool
	closed        bool
	armed         bool
	solicitedOnly bool
	users         int // QPs using the CQ

	armedHint atomic.Bool // armed, readable without mu
	// pending is set, under mu, whenever Poll has something to do (a completion, or the
	// error of a closed or overflowed CQ): an empty poll, which spinning consumers make
	// in a loop, returns without taking mu, as a hardware CQ's poll reads one entry.
	pending atomic.Bool

	eventQueued bool // an event for this CQ waits in ch; guarded by ch.mu
}

// entry is a completion and the work-queue slots that polling it releases.
type entry struct {
	wc       verbs.WorkCompletion
	owner    *Slots
	sendSlot uint32 // send-queue slots released: the WR and the unsignaled WRs before it
	recvSlot uint32 // receive-queue slots released
}

// Init makes c an empty CQ of capacity entries for provider p. self is the provider's
// CQ that holds c; ch, if not nil, is its completion channel, to which the caller has
// attached it (Channel.Attach).
func (c *CQ) Init(p *Provider, self verbs.CQ, capacity int, ch *Channel) {
	c.p, c.self, c.ch = p, self, ch
	c.ring = make([]entry, capacity)
}

// Capacity returns how many completions the CQ holds.
func (c *CQ) Capacity() int { return len(c.ring) }

// Armed reports, without locking, whether the CQ is armed: whether a consumer waits for
// its next completion's event rather than polling.
func (c *CQ) Armed() bool { return c.armedHint.Load() }

// Poll moves up to len(wc) completions into wc and releases their work-queue slots. It
// allocates nothing.
func (c *CQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	if !c.pending.Load() {
		return 0, nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, c.p.errPollClosed
	}
	if c.overflowed {
		c.mu.Unlock()
		return 0, c.p.errPollOverflow
	}
	n := min(len(wc), c.n)
	for i := range n {
		e := &c.ring[c.head]
		wc[i] = e.wc
		if e.sendSlot != 0 {
			e.owner.SQ.Add(uint64(e.sendSlot))
		}
		if e.recvSlot != 0 {
			e.owner.RQ.Add(uint64(e.recvSlot))
		}
		e.owner = nil
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.n -= n
	c.pending.Store(c.n > 0)
	c.mu.Unlock()
	return n, nil
}

// Push adds a completion of the QP whose slots are owner; polling it releases sendSlot
// send-queue and recvSlot receive-queue slots. solicited says whether it wakes a CQ armed
// for solicited completions only. Push reports false, and marks the CQ overflowed, if the
// CQ was full (or is closed or overflowed); the caller then moves the QP to ERROR.
func (c *CQ) Push(wc *verbs.WorkCompletion, owner *Slots, sendSlot, recvSlot uint32, solicited bool) bool {
	c.mu.Lock()
	if c.closed || c.overflowed {
		c.mu.Unlock()
		return false
	}
	if c.n == len(c.ring) {
		c.overflowed = true
		c.pending.Store(true)
		c.mu.Unlock()
		return false
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	e := &c.ring[i] // filled field by field: a composite literal is built aside and copied
	e.wc = *wc
	e.owner, e.sendSlot, e.recvSlot = owner, sendSlot, recvSlot
	c.n++
	c.pending.Store(true)
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

// Forget removes the completions of the QP whose slots are owner, as destroying or
// resetting a QP cleans its completions from its CQs. Their slots are not released.
func (c *CQ) Forget(owner *Slots) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := 0
	for k := range c.n {
		e := c.ring[(c.head+k)%len(c.ring)]
		if e.owner == owner {
			continue
		}
		c.ring[(c.head+kept)%len(c.ring)] = e
		kept++
	}
	for k := kept; k < c.n; k++ {
		c.ring[(c.head+k)%len(c.ring)] = entry{}
	}
	c.n = kept
	c.pending.Store(c.n > 0 || c.overflowed || c.closed)
}

// Use records that a QP uses the CQ, or fails with [verbs.ErrClosed] once it is closed.
func (c *CQ) Use() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return verbs.ErrClosed
	}
	c.users++
	return nil
}

// Unuse records that a QP no longer uses the CQ.
func (c *CQ) Unuse() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
}

// ReqNotify arms the CQ: the next completion added to it (with solicitedOnly, the next
// solicited or failed one) produces one event on its channel. Completions already in the
// CQ produce none, so poll once more after arming.
func (c *CQ) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return fmt.Errorf("%s: arm CQ: %w", c.p.name, verbs.ErrClosed)
	case c.overflowed:
		return fmt.Errorf("%s: arm CQ: %w", c.p.name, verbs.ErrCQOverflow)
	}
	if !c.armed {
		c.armed, c.solicitedOnly = true, solicitedOnly
	} else if !solicitedOnly {
		c.solicitedOnly = false
	}
	c.armedHint.Store(true)
	return nil
}

// Close destroys the CQ, which fails while QPs use it, and detaches it from its channel,
// discarding an event not yet taken. The caller then releases what the CQ held of its
// context.
func (c *CQ) Close() error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return fmt.Errorf("%s: destroy CQ: %w", c.p.name, verbs.ErrClosed)
	case c.users > 0:
		c.mu.Unlock()
		return fmt.Errorf("%s: destroy CQ used by %d QPs: %w", c.p.name, c.users, verbs.ErrBusy)
	}
	c.closed = true
	clear(c.ring)
	c.n = 0
	c.pending.Store(true) // Poll reports the close
	c.mu.Unlock()
	if c.ch != nil {
		c.ch.drop(c)
		c.ch.refs.Release()
	}
	return nil
}

// Channel is the core of a completion channel: it delivers events of armed CQs. Events
// are coalesced per CQ: a CQ armed and triggered again before its event was taken still
// has a single event waiting, as one ibv_get_cq_event covers them.
type Channel struct {
	p    *Provider
	refs Refs // attached CQs

	mu      sync.Mutex
	pending []*CQ // CQs with an event, oldest first from head
	head    int
	closed  bool

	wake chan struct{} // a token when pending may be non-empty
	done chan struct{} // closed by Close
}

// Init makes ch an open channel of provider p with no CQ attached.
func (ch *Channel) Init(p *Provider) {
	ch.p = p
	ch.wake = make(chan struct{}, 1)
	ch.done = make(chan struct{})
}

// Attach records that a CQ being created uses the channel, or fails with
// [verbs.ErrClosed] once the channel is closed. CQ.Close detaches it.
func (ch *Channel) Attach() error { return ch.refs.Acquire() }

// notify queues an event for cq. The caller holds cq.mu.
func (ch *Channel) notify(cq *CQ) {
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
func (ch *Channel) drop(cq *CQ) {
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
// returns that CQ (the provider's), with its event acknowledged. It returns ctx.Err() when
// ctx ends first and an error wrapping [verbs.ErrClosed] once the channel is closed.
func (ch *Channel) Wait(ctx context.Context) (verbs.CQ, error) {
	for {
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return nil, fmt.Errorf("%s: wait for CQ event: %w", ch.p.name, verbs.ErrClosed)
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
			return cq.self, nil
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

// Close closes the channel and wakes every Wait. It fails with [verbs.ErrBusy] while CQs
// are attached. The caller then releases what the channel held of its context.
func (ch *Channel) Close() error {
	if err := ch.refs.Close(); err != nil {
		return fmt.Errorf("%s: destroy completion channel: %w", ch.p.name, err)
	}
	ch.mu.Lock()
	ch.closed = true
	ch.mu.Unlock()
	close(ch.done)
	return nil
}
