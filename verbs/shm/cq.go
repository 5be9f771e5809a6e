package shm

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// provider names shm in the errors of the RC core it shares with verbs/soft.
var provider = rc.NewProvider("shm")

// CQ is a completion queue of fixed capacity. It implements [verbs.CQ].
//
// A completion that finds the queue full is lost and the queue overflows: from then on
// Poll fails with [verbs.ErrCQOverflow], and every QP that tries to add a completion to it
// moves to ERROR, as the IBV_EVENT_CQ_ERR of a real overrun leaves its QPs.
//
// Work-queue slots are released when their completion is polled, not when it is
// generated, as on hardware whose driver advances the queue tail while polling: a QP whose
// completions sit unpolled in a CQ cannot post into those slots. The rules are the RC
// core's (verbs/internal/rc), which verbs/soft shares; what is shm's own is that Poll
// and ReqNotify drive the rings of the QPs that feed the CQ (drive.go).
type CQ struct {
	ctx  *Context
	core rc.CQ

	feedMu  sync.Mutex
	feeders atomic.Pointer[[]*QP] // QPs whose rings Poll drains (drive.go)
	polls   atomic.Uint64         // Poll calls, for the goroutines that watch them
	// peekMu keeps the rings' mappings alive while Polls look into them without the
	// rings' locks (drive.go): a Poll holds it for reading, and whoever unmaps a ring
	// that feeds the CQ takes it for writing first (awaitPeeks).
	peekMu sync.RWMutex
}

func newCQ(c *Context, cqe int, ch *CompChannel) *CQ {
	cq := &CQ{ctx: c}
	var core *rc.Channel
	if ch != nil {
		core = &ch.core
	}
	cq.core.Init(provider, cq, cqe, core)
	return cq
}

// Capacity returns how many completions the CQ holds. The conformance suite uses it to
// overflow the CQ exactly.
func (c *CQ) Capacity() int { return c.core.Capacity() }

// Poll moves up to len(wc) completions into wc. It allocates nothing.
//
// It first drains the rings of the QPs that feed the CQ (drive.go): a polling
// application moves their requests and responses itself. An empty Poll keeps looking
// for a few microseconds before it returns (pollwait.go).
func (c *CQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	c.polls.Add(1)
	var n int
	var err error
	found := spinPoll(hostNow, func() bool { // a moment's wait for the peer (pollwait.go)
		c.drive()
		n, err = c.core.Poll(wc)
		return n != 0 || err != nil
	})
	if !found {
		yieldCPU() // its policy decides whether the processor is given up (yield.go)
	}
	return n, err
}

// push adds a completion for qp. solicited says whether it wakes a CQ armed for solicited
// completions only. It reports false, and marks the CQ overflowed, if the CQ was full; the
// caller then moves qp to ERROR.
func (c *CQ) push(wc *verbs.WorkCompletion, qp *QP, sendSlot, recvSlot uint32, solicited bool) bool {
	return c.core.Push(wc, &qp.polled, sendSlot, recvSlot, solicited)
}

// forget removes the completions of qp, as destroying or resetting a QP cleans its
// completions from its CQs.
func (c *CQ) forget(qp *QP) { c.core.Forget(&qp.polled) }

// use records that a QP uses the CQ.
func (c *CQ) use() error { return c.core.Use() }

func (c *CQ) unuse() { c.core.Unuse() }

// ReqNotify arms the CQ: the next completion added to it (with solicitedOnly, the next
// solicited or failed one) produces one event on its channel. Completions already in the
// CQ produce none, so poll once more after arming.
//
// Arming also tells the peers that feed the CQ through rings to ring their doorbells:
// no one polls them now (drive.go).
func (c *CQ) ReqNotify(solicitedOnly bool) error {
	if err := c.core.ReqNotify(solicitedOnly); err != nil {
		return err
	}
	c.announceSleep()
	return nil
}

// Close destroys the CQ. QPs using it must be closed first.
func (c *CQ) Close() error {
	if err := c.core.Close(); err != nil {
		return err
	}
	c.ctx.refs.Release()
	c.ctx.dev.nCQ.Add(-1)
	return nil
}

// CompChannel delivers events of armed CQs. It implements [verbs.CompChannel]. Events are
// coalesced per CQ: a CQ armed and triggered again before its event was taken still has a
// single event waiting, as one ibv_get_cq_event covers them.
type CompChannel struct {
	ctx  *Context
	core rc.Channel
}

func newCompChannel(c *Context) *CompChannel {
	ch := &CompChannel{ctx: c}
	ch.core.Init(provider)
	return ch
}

// Wait blocks the calling goroutine until an armed CQ of this channel gets a completion and
// returns that CQ, with its event acknowledged. It returns ctx.Err() when ctx ends first and
// an error wrapping [verbs.ErrClosed] once the channel is closed.
func (ch *CompChannel) Wait(ctx context.Context) (verbs.CQ, error) { return ch.core.Wait(ctx) }

// Close closes the channel and wakes every Wait. CQs attached to it must be closed first.
func (ch *CompChannel) Close() error {
	if err := ch.core.Close(); err != nil {
		return err
	}
	ch.ctx.refs.Release()
	return nil
}
