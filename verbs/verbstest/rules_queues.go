package verbstest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testSendQueueOverflow: with max_send_wr WRs outstanding, the next post fails at once
// with ErrQueueFull, naming the first rejected request of the batch; slots come back when
// completions are polled. A queue may hold more than it reports (see requireCapacity).
func testSendQueueOverflow(t *testing.T, p providers) {
	cfg := defaults()
	cfg.caps.MaxSendWR = 16
	bcfg := cfg
	bcfg.caps.MaxRecvWR = 1024
	a, b := newPair(t, p, cfg, bcfg)

	// SENDs to a peer without receive WQEs stall in RNR retries (forever), so they stay
	// outstanding however fast the provider is.
	capacity := 0
	for ; capacity < fillLimit(16); capacity++ {
		err := a.qp.PostSend([]verbs.SendWR{sendWR(uint64(capacity), a.mr, 0, 0, verbs.SendSignaled)})
		if err != nil {
			requirePostError(t, err, 0, verbs.ErrQueueFull)
			break
		}
	}
	require.GreaterOrEqual(t, capacity, 16, "send queue refused WRs below max_send_wr")
	require.Less(t, capacity, fillLimit(16), "send queue never filled")
	requireCapacity(t, "send", sendCapacity(a.qp), capacity)
	err := a.qp.PostSend([]verbs.SendWR{sendWR(999, a.mr, 0, 0, verbs.SendSignaled)})
	requirePostError(t, err, 0, verbs.ErrQueueFull)

	// Let them complete; until polled, their slots stay taken.
	postRecvs(t, b.qp, 0, capacity)
	wcs := pollN(t, a.scq, capacity)
	for i, wc := range wcs {
		requireWC(t, wc, uint64(i), verbs.WCSuccess)
	}
	pollN(t, b.rcq, capacity)

	// A batch twice as long as the queue, posted to an empty queue: a provider that frees
	// slots when completions are polled posts exactly capacity of them and refuses the
	// next, naming it; one that frees a slot as soon as its WQE retires may take more,
	// even all (rxe on kernel 6.1 took a batch of 32 into a queue that had refused its
	// 32nd stalled SEND). Either way the requests before the refused one are posted and
	// complete, none from it on is, and the post does not refuse below the capacity.
	batch := make([]verbs.SendWR, 2*capacity)
	for i := range batch {
		batch[i] = writeWR(uint64(1000+i), a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
	}
	posted := len(batch)
	if err := a.qp.PostSend(batch); err != nil {
		var pe *verbs.PostError
		require.ErrorAs(t, err, &pe)
		require.ErrorIs(t, err, verbs.ErrQueueFull)
		posted = pe.Index
		require.GreaterOrEqual(t, posted, max(sendCapacity(a.qp), 16), "a batch into an empty send queue refused below its capacity")
	}
	wcs = pollN(t, a.scq, posted)
	for i, wc := range wcs {
		requireWC(t, wc, uint64(1000+i), verbs.WCSuccess)
	}
	requireEmpty(t, a.scq, "the refused requests of the batch were not posted")
}

// testRecvQueueOverflow: with max_recv_wr receive WRs outstanding, the next post fails at
// once with ErrQueueFull; a slot comes back when its completion is polled.
func testRecvQueueOverflow(t *testing.T, p providers) {
	cfg := defaults()
	bcfg := cfg
	bcfg.caps.MaxRecvWR = 16
	a, b := newPair(t, p, cfg, bcfg)

	capacity := 0
	for ; capacity < fillLimit(16); capacity++ {
		err := b.qp.PostRecv([]verbs.RecvWR{{ID: uint64(capacity)}})
		if err != nil {
			requirePostError(t, err, 0, verbs.ErrQueueFull)
			break
		}
	}
	require.GreaterOrEqual(t, capacity, 16, "receive queue refused WRs below max_recv_wr")
	require.Less(t, capacity, fillLimit(16), "receive queue never filled")
	requireCapacity(t, "receive", recvCapacity(b.qp), capacity)

	// Consume one; its slot is free once its completion is polled.
	post(t, a.qp, writeWR(1, a.mr, 0, 0, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 1, verbs.WCSuccess)
	requireWC(t, pollOne(t, b.rcq), 0, verbs.WCSuccess)
	err := b.qp.PostRecv([]verbs.RecvWR{{ID: 100}, {ID: 101}})
	requirePostError(t, err, 1, verbs.ErrQueueFull)

	// The receive WQEs are consumed in order: 1, 2, ..., then 100.
	for i := 1; i < capacity; i++ {
		post(t, a.qp, writeWR(uint64(i), a.mr, 0, 0, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
		requireWC(t, pollOne(t, a.scq), uint64(i), verbs.WCSuccess)
		requireWC(t, pollOne(t, b.rcq), uint64(i), verbs.WCSuccess)
	}
	post(t, a.qp, writeWR(500, a.mr, 0, 0, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
	requireWC(t, pollOne(t, b.rcq), 100, verbs.WCSuccess)
}

// requireCapacity checks the number of WRs a queue took before refusing one (found)
// against the capacity the QP reports (0: none). ibv_create_qp(3) promises at least the
// reported capacity; posting beyond it is outside the contract, and devices differ: soft
// refuses exactly there, while rxe on kernel 6.1 reports 16 for a queue whose ring holds
// 31. So the rule requires found ≥ reported and not found == reported.
func requireCapacity(t *testing.T, queue string, reported, found int) {
	t.Helper()
	if reported > 0 {
		require.GreaterOrEqual(t, found, reported, "%s queue refused a WR below the capacity it reports", queue)
	}
}

// testUnsignaledNoCompletion: unsignaled WRs execute but produce no completion; the next
// signaled WR produces exactly one.
func testUnsignaledNoCompletion(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	const n = 8
	for i := range n {
		a.mr.Bytes()[i] = byte(0x80 + i)
		post(t, a.qp, writeWR(uint64(i), a.mr, i, 1, b.mr, i, verbs.OpRDMAWrite, 0))
	}
	waitFor(t, "unsignaled writes to land", func() bool { return readByte(t, b.mr, n-1) == byte(0x80+n-1) })
	require.Equal(t, a.mr.Bytes()[:n], b.mr.Bytes()[:n])
	requireEmpty(t, a.scq, "unsignaled writes")

	post(t, a.qp, writeWR(100, a.mr, 0, 4, b.mr, 100, verbs.OpRDMAWrite, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 100, verbs.WCSuccess)
	requireEmpty(t, a.scq, "one signaled write after unsignaled ones")

	// With SignalAll every WR is signaled, flag or not.
	cfg := defaults()
	cfg.signalAll = true
	c, d := newPair(t, p, cfg)
	post(t, c.qp, writeWR(1, c.mr, 0, 4, d.mr, 0, verbs.OpRDMAWrite, 0), writeWR(2, c.mr, 0, 4, d.mr, 0, verbs.OpRDMAWrite, 0))
	wcs := pollN(t, c.scq, 2)
	requireWC(t, wcs[0], 1, verbs.WCSuccess)
	requireWC(t, wcs[1], 2, verbs.WCSuccess)
}

// testUnsignaledSlotsFreedBySignaled: unsignaled WRs produce no completion, and their
// send-queue slots are free at the latest once a later signaled WR's completion is polled.
//
// When exactly a slot is freed differs between devices, and the verbs contract allows
// both: ibv_post_send(3) makes the application post a signaled WR at least once per
// send-queue depth, because a provider may keep the slots of unsignaled WRs until it
// retires a signaled one, and release them when that completion is polled (soft does, as
// do drivers that advance the queue tail while polling), while another provider may free a
// slot as soon as its WQE retires (rxe). The rule therefore accepts either answer where
// they differ (a post while only unsignaled or unpolled WRs hold the queue), and fails a
// provider that refuses WRs below the queue's capacity, that reports a completion for an
// unsignaled WR, or that has not freed the queue once the signaled completion is polled.
func testUnsignaledSlotsFreedBySignaled(t *testing.T, p providers) {
	cfg := defaults()
	cfg.caps.MaxSendWR = 8

	// A send queue's worth of unsignaled writes: all accepted, all executed, no completion.
	a, b := newPair(t, p, cfg)
	capacity := max(sendCapacity(a.qp), cfg.caps.MaxSendWR)
	for i := range capacity {
		a.mr.Bytes()[i] = byte(i + 1)
		post(t, a.qp, writeWR(uint64(i), a.mr, i, 1, b.mr, i, verbs.OpRDMAWrite, 0))
	}
	last := capacity - 1
	waitFor(t, "unsignaled writes to execute", func() bool { return readByte(t, b.mr, last) == byte(last+1) })
	requireEmpty(t, a.scq, "unsignaled writes")
	// Either refused (slots held until a signaled completion is polled) or accepted (slots
	// freed when the WQEs retired).
	err := a.qp.PostSend([]verbs.SendWR{writeWR(99, a.mr, 0, 1, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)})
	if err != nil {
		requirePostError(t, err, 0, verbs.ErrQueueFull)
	} else {
		requireWC(t, pollOne(t, a.scq), 99, verbs.WCSuccess)
	}

	// capacity-1 unsignaled and one signaled: polling the one completion frees them all.
	c, d := newPair(t, p, cfg)
	for i := range capacity - 1 {
		post(t, c.qp, writeWR(uint64(i), c.mr, 0, 1, d.mr, 0, verbs.OpRDMAWrite, 0))
	}
	post(t, c.qp, writeWR(50, c.mr, 0, 1, d.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
	// Its completion is not polled yet: refused or accepted, as above.
	err = c.qp.PostSend([]verbs.SendWR{writeWR(98, c.mr, 0, 1, d.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)})
	extra := 0
	if err != nil {
		requirePostError(t, err, 0, verbs.ErrQueueFull)
	} else {
		extra = 1
	}
	wcs := pollN(t, c.scq, 1+extra)
	requireWC(t, wcs[0], 50, verbs.WCSuccess)
	if extra > 0 {
		requireWC(t, wcs[1], 98, verbs.WCSuccess)
	}
	requireEmpty(t, c.scq, "signaled WRs behind unsignaled ones")
	batch := make([]verbs.SendWR, capacity)
	for i := range batch {
		batch[i] = writeWR(uint64(100+i), c.mr, 0, 1, d.mr, 0, verbs.OpRDMAWrite, 0)
	}
	batch[capacity-1].Flags = verbs.SendSignaled
	require.NoError(t, c.qp.PostSend(batch), "a full queue's worth after polling the signaled completion")
	requireWC(t, pollOne(t, c.scq), uint64(100+capacity-1), verbs.WCSuccess)
	requireEmpty(t, c.scq, "a batch with one signaled WR")
}

// testCQOverflow: a CQ holds as many completions as it reports; one more overflows it,
// and Poll then fails with ErrCQOverflow, even a Poll of no completions.
func testCQOverflow(t *testing.T, p providers) {
	cfg := defaults()
	cfg.sendCQE = 4
	cfg.caps.MaxSendWR = 128
	a, b := newPair(t, p, cfg)

	capacity := 0
	if c, ok := a.scq.(CapacityReporter); ok {
		capacity = c.Capacity()
		require.GreaterOrEqual(t, capacity, 4, "CQ capacity")
		// Exactly capacity completions fit.
		for i := range capacity {
			post(t, a.qp, writeWR(uint64(i), a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
		}
		wcs := pollN(t, a.scq, capacity)
		requireWC(t, wcs[capacity-1], uint64(capacity-1), verbs.WCSuccess)
	}
	// One more than the CQ holds (or, without a reported capacity, the whole send queue).
	n := capacity + 1
	if capacity == 0 {
		n = cfg.caps.MaxSendWR
	}
	for i := range n {
		a.mr.Bytes()[i] = byte(i + 1)
		post(t, a.qp, writeWR(uint64(100+i), a.mr, i, 1, b.mr, i, verbs.OpRDMAWrite, verbs.SendSignaled))
	}
	// Await the overflow without polling completions, which would make room: a Poll of
	// none reports it.
	waitFor(t, fmt.Sprintf("a CQ of %d entries to overflow with %d completions", cfg.sendCQE, n), func() bool {
		_, err := a.scq.Poll(nil)
		if err != nil {
			require.ErrorIs(t, err, verbs.ErrCQOverflow)
			return true
		}
		return false
	})
	var wc [4]verbs.WorkCompletion
	_, err := a.scq.Poll(wc[:])
	require.ErrorIs(t, err, verbs.ErrCQOverflow, "an overflowed CQ stays unusable")
}
