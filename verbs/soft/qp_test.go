package soft_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestRNRRetryCount checks that rnr_retry n means n retries: n+1 RNR NAKs in all.
func TestRNRRetryCount(t *testing.T) {
	for _, n := range []uint8{0, 1, 3, 6} {
		f := newFabric(t, soft.Options{Devices: 2})
		a, _ := connectPair(t, f, pairOpts{rnrRetry: n, exactRNR: true, rnrTimer: 14})
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled}}))
		wc := poll(t, a.scq, 1)[0]
		require.Equal(t, verbs.WCRNRRetryExcErr, wc.Status)
		require.Equal(t, uint64(n)+1, f.Stats().RNRNAKs, "RNR NAKs with rnr_retry %d", n)
	}
}

// TestRNRRetryForeverKeepsRetrying checks that rnr_retry 7 retries well past 7 times and
// that a receive posted meanwhile waits for the RNR timer. It runs on synctest's clock: the
// RNR timer and the poll's backoff take no real time.
func TestRNRRetryForeverKeepsRetrying(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFabric(t, soft.Options{Devices: 2})
		a, b := connectPair(t, f, pairOpts{rnrRetry: 7, rnrTimer: 1})
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled}}))
		deadline := time.Now().Add(20 * time.Second)
		for f.Stats().RNRNAKs < 20 {
			require.False(t, time.Now().After(deadline), "RNR retries stopped at %d", f.Stats().RNRNAKs)
			time.Sleep(time.Millisecond)
		}
		requireEmpty(t, a.scq)
		require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 9}}))
		require.Equal(t, verbs.WCSuccess, poll(t, a.scq, 1)[0].Status)
		require.Equal(t, uint64(9), poll(t, b.rcq, 1)[0].WRID)
	})
}

// TestRetryBudget checks that a lost request is retransmitted retry_cnt times, one ACK
// timeout apart, before RETRY_EXC_ERR. On synctest's clock the elapsed time is exact.
func TestRetryBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const scale = 0.05
		f := newFabric(t, soft.Options{Devices: 2, TimeScale: scale})
		a, _ := connectPair(t, f, pairOpts{timeout: 16, retry: 2})
		require.NoError(t, f.BreakQP(a.qp))
		start := time.Now()
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, a.mr, 0, 8)}))
		wc := poll(t, a.scq, 1)[0]
		elapsed := time.Since(start)
		require.Equal(t, verbs.WCRetryExcErr, wc.Status)
		require.Equal(t, uint64(2), f.Stats().Retries)
		budget := 3 * 4096 * (1 << 16) * time.Nanosecond / 20 // (retry+1) × 4.096 µs × 2^16, scaled
		require.GreaterOrEqual(t, elapsed, budget, "RETRY_EXC_ERR before the retry budget")
		require.Equal(t, verbs.QPStateError, a.qp.State())
	})
}

// TestTimeoutZeroWaitsForever checks that with ACK timeout 0 a lost request is never
// given up, and is flushed when the QP moves to ERROR. It runs in a synctest bubble: the
// fake clock moves a day on, past the longest ACK timeout any QP can arm, and once every
// goroutine is durably blocked nothing more can happen, so the empty CQ is decided, not
// sampled.
func TestTimeoutZeroWaitsForever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFabric(t, soft.Options{Devices: 2})
		a, b := connectPair(t, f, pairOpts{infiniteTimeout: true})
		require.NoError(t, f.BreakQP(a.qp))
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))
		time.Sleep(24 * time.Hour) // synctest's clock: fires any retry timer armed
		synctest.Wait()
		requireEmpty(t, a.scq)
		require.Equal(t, verbs.QPStateRTS, a.qp.State())
		require.Zero(t, f.Stats().Retries)
		require.NoError(t, a.qp.ToError())
		require.Equal(t, verbs.WCWRFlushErr, poll(t, a.scq, 1)[0].Status)
	})
}

// TestPSNMismatch checks that a requester whose PSN the responder does not expect is lost.
func TestPSNMismatch(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	o := pairOpts{}
	o.defaults(f)
	a := newSide(t, f, o.devA, o, 0x1000)
	b := newSide(t, f, o.devB, o, 0x2000)
	require.NoError(t, a.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	require.NoError(t, b.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	require.NoError(t, a.qp.ToRTR(rtr(a, b, o)))
	require.NoError(t, b.qp.ToRTR(rtr(b, a, o)))
	a.psn++ // a starts at a PSN b does not expect
	require.NoError(t, a.qp.ToRTS(rts(a, o)))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))
	require.Equal(t, verbs.WCRetryExcErr, poll(t, a.scq, 1)[0].Status)
}

// TestPSNAdvancesPerPacket checks that PSNs advance by one per MTU-sized packet on both
// sides, so long messages keep a connection in step.
func TestPSNAdvancesPerPacket(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	for i, n := range []int{0, 1, 4096, 4097, 60000} {
		require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(uint64(i), a.mr, b.mr, 0, n)}))
		require.Equal(t, verbs.WCSuccess, poll(t, a.scq, 1)[0].Status, "message %d of %d bytes", i, n)
		require.Equal(t, uint32(n), poll(t, b.rcq, 1)[0].ByteLen)
	}
}

// TestPostValidation checks the errors PostSend and PostRecv report at post time.
func TestPostValidation(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	tests := []struct {
		name string
		wr   verbs.SendWR
		want error
	}{
		{"Opcode", verbs.SendWR{Opcode: 9}, verbs.ErrInvalidArgument},
		{"TooManySGEs", verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{sge(a.mr, 0, 1), sge(a.mr, 1, 1), sge(a.mr, 2, 1)}}, verbs.ErrInvalidArgument},
		{"InlineTooLarge", verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendInline, SGL: []verbs.SGE{sge(a.mr, 0, 65)}}, verbs.ErrInvalidArgument},
		{"InlineRead", verbs.SendWR{Opcode: verbs.OpRDMARead, Flags: verbs.SendInline, SGL: []verbs.SGE{sge(a.mr, 0, 8)}}, verbs.ErrInvalidArgument},
		{"InlineUnregistered", verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendInline, SGL: []verbs.SGE{{Addr: 0x10, Length: 8}}}, verbs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		err := a.qp.PostSend([]verbs.SendWR{tc.wr})
		var pe *verbs.PostError
		require.ErrorAs(t, err, &pe, tc.name)
		require.Zero(t, pe.Index)
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	err := b.qp.PostRecv([]verbs.RecvWR{{ID: 1}, {SGL: []verbs.SGE{sge(b.mr, 0, 1), sge(b.mr, 1, 1), sge(b.mr, 2, 1)}}})
	var pe *verbs.PostError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Index)
	require.ErrorIs(t, err, verbs.ErrInvalidArgument)

	// Inline data is found by address when the LKey names no region that holds it.
	wr := verbs.SendWR{ID: 5, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendInline | verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr() + 100, Length: 8, LKey: 0}}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	copy(a.mr.Bytes()[100:], "inline!!")
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}))
	require.Equal(t, verbs.WCSuccess, poll(t, a.scq, 1)[0].Status)
	require.Equal(t, "inline!!", string(b.mr.Bytes()[:8]))

	require.NoError(t, a.qp.Close())
	err = a.qp.PostSend([]verbs.SendWR{wr})
	require.ErrorIs(t, err, verbs.ErrClosed)
	require.ErrorIs(t, a.qp.Close(), verbs.ErrClosed)
}

// TestTransitionErrors checks that invalid attributes fail with ErrInvalidArgument and
// change nothing.
func TestTransitionErrors(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	o := pairOpts{}
	o.defaults(f)
	a := newSide(t, f, o.devA, o, 1)
	b := newSide(t, f, o.devB, o, 2)
	inits := []verbs.InitAttr{{Port: 0}, {Port: 2}, {Port: 1, PKeyIndex: 1}, {Port: 1, Access: 1 << 6}}
	for _, attr := range inits {
		require.ErrorIs(t, a.qp.ToInit(attr), verbs.ErrInvalidArgument, "ToInit(%+v)", attr)
		require.Equal(t, verbs.QPStateReset, a.qp.State())
	}
	require.NoError(t, a.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	good := rtr(a, b, o)
	rtrs := []func(*verbs.RTRAttr){
		func(r *verbs.RTRAttr) { r.PathMTU = 0 },
		func(r *verbs.RTRAttr) { r.PathMTU = 6 },
		func(r *verbs.RTRAttr) { r.DestQPN = 1 << 24 },
		func(r *verbs.RTRAttr) { r.RQPSN = 1 << 24 },
		func(r *verbs.RTRAttr) { r.Dest.IsGlobal = false },
		func(r *verbs.RTRAttr) { r.Dest.Port = 0 },
		func(r *verbs.RTRAttr) { r.Dest.SGIDIndex = 2 },
		func(r *verbs.RTRAttr) { r.MinRNRTimer = 32 },
	}
	for i, edit := range rtrs {
		attr := good
		edit(&attr)
		require.ErrorIs(t, a.qp.ToRTR(attr), verbs.ErrInvalidArgument, "ToRTR case %d", i)
		require.Equal(t, verbs.QPStateInit, a.qp.State())
	}
	require.NoError(t, a.qp.ToRTR(good))
	rtsGood := rts(a, o)
	rtss := []func(*verbs.RTSAttr){
		func(r *verbs.RTSAttr) { r.SQPSN = 1 << 24 },
		func(r *verbs.RTSAttr) { r.Timeout = 32 },
		func(r *verbs.RTSAttr) { r.RetryCount = 8 },
		func(r *verbs.RTSAttr) { r.RNRRetry = 8 },
	}
	for i, edit := range rtss {
		attr := rtsGood
		edit(&attr)
		require.ErrorIs(t, a.qp.ToRTS(attr), verbs.ErrInvalidArgument, "ToRTS case %d", i)
		require.Equal(t, verbs.QPStateRTR, a.qp.State())
	}
	require.NoError(t, a.qp.ToRTS(rtsGood))
}

// TestResetDiscards checks that ToReset and Close discard queued WRs and remove the QP's
// completions from its CQs without completions of their own.
func TestResetDiscards(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	require.NoError(t, a.qp.PostRecv([]verbs.RecvWR{{ID: 1}, {ID: 2}}))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))  // RNR: queued
	require.NoError(t, b.qp.PostSend([]verbs.SendWR{writeImm(7, b.mr, a.mr, 64, 8)})) // consumes a's recv 1
	require.Equal(t, verbs.WCSuccess, poll(t, b.scq, 1)[0].Status)
	require.NoError(t, a.qp.ToReset())
	requireEmpty(t, a.rcq)
	requireEmpty(t, a.scq)
	require.Equal(t, verbs.QPStateReset, a.qp.State())
	// Every slot is free again.
	require.NoError(t, a.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	wrs := make([]verbs.RecvWR, 16)
	require.NoError(t, a.qp.PostRecv(wrs))
}

// TestCQOverflowFailsQP checks that the QP whose completion overflowed its CQ moves to
// ERROR, and that an overflowed CQ refuses to be armed.
func TestCQOverflowFailsQP(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{cqe: 2})
	for i := range 3 {
		wr := writeImm(uint64(i), a.mr, b.mr, 0, 8)
		wr.Opcode = verbs.OpRDMAWrite
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}), "write %d", i)
	}
	require.Equal(t, verbs.QPStateError, a.qp.State())
	var wc [4]verbs.WorkCompletion
	_, err := a.scq.Poll(wc[:])
	require.ErrorIs(t, err, verbs.ErrCQOverflow)
	require.ErrorIs(t, a.scq.ReqNotify(false), verbs.ErrCQOverflow)
	require.Equal(t, verbs.QPStateRTS, b.qp.State())
}

// TestCompChannelClose checks channel life cycle rules, Close waking a blocked Wait among
// them: synctest.Wait decides that the waiter is parked before Close.
func TestCompChannelClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFabric(t, soft.Options{})
		ctx, err := f.Open("soft0")
		require.NoError(t, err)
		defer ctx.Close()
		ch, err := ctx.CreateCompChannel()
		require.NoError(t, err)
		cq, err := ctx.CreateCQ(4, ch, 0)
		require.NoError(t, err)
		require.ErrorIs(t, ch.Close(), verbs.ErrBusy, "close channel with a CQ")
		require.NoError(t, cq.ReqNotify(false))
		require.NoError(t, cq.Close())
		var wc [1]verbs.WorkCompletion
		_, err = cq.Poll(wc[:])
		require.ErrorIs(t, err, verbs.ErrClosed)
		require.ErrorIs(t, cq.ReqNotify(false), verbs.ErrClosed)

		done := make(chan error)
		go func() {
			_, err := ch.Wait(t.Context())
			done <- err
		}()
		synctest.Wait()
		require.NoError(t, ch.Close())
		require.ErrorIs(t, <-done, verbs.ErrClosed)
		require.ErrorIs(t, ch.Close(), verbs.ErrClosed)
	})
}

// TestCompChannelManyCQs checks that events of several CQs all reach waiters.
func TestCompChannelManyCQs(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	o := pairOpts{}
	o.defaults(f)
	ctx, err := f.Open("soft0")
	require.NoError(t, err)
	ch, err := ctx.CreateCompChannel()
	require.NoError(t, err)
	a := newSide(t, f, "soft1", o, 1)
	t.Cleanup(func() {
		require.NoError(t, ch.Close())
		require.NoError(t, ctx.Close())
	})
	// Several receivers on one channel; two goroutines wait.
	const n = 4
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	var qps []verbs.QP
	var cqs []verbs.CQ
	for i := range n {
		cq, err := ctx.CreateCQ(4, ch, 0)
		require.NoError(t, err)
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1}})
		require.NoError(t, err)
		require.NoError(t, qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
		require.NoError(t, qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: a.qp.QPN(), RQPSN: 1,
			Dest: verbs.AddressVector{Port: 1, IsGlobal: true, DestGID: a.gid}}))
		require.NoError(t, qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
		require.NoError(t, cq.ReqNotify(false))
		qps, cqs = append(qps, qp), append(cqs, cq)
	}
	t.Cleanup(func() {
		for i := range n {
			require.NoError(t, qps[i].Close())
			require.NoError(t, cqs[i].Close())
		}
		require.NoError(t, pd.Close())
	})
	got := make(chan verbs.CQ, n)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // runs first: after t.Context() ends the waits
	for range 2 {
		wg.Go(func() {
			for {
				cq, err := ch.Wait(t.Context())
				if err != nil {
					return
				}
				got <- cq
				if len(got) == n {
					return
				}
			}
		})
	}
	// Fail every receiver: each flush is an error completion, which wakes its CQ.
	for _, qp := range qps {
		require.NoError(t, f.FailQP(qp))
	}
	seen := map[verbs.CQ]bool{}
	for range n {
		select {
		case cq := <-got:
			seen[cq] = true
		case <-time.After(20 * time.Second):
			t.Fatal("events lost")
		}
	}
	require.Len(t, seen, n)
}

// TestNotConnectedBack checks that a responder connected to another QP drops what a
// stranger sends it, although the stranger names it correctly and uses the PSN it expects.
func TestNotConnectedBack(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	b, c := connectPair(t, f, pairOpts{}) // b and c are connected
	o := pairOpts{}
	o.defaults(f)
	a := newSide(t, f, "soft0", o, c.psn) // a sends with the PSN b expects from c
	require.NoError(t, a.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	require.NoError(t, a.qp.ToRTR(rtr(a, b, o)))
	require.NoError(t, a.qp.ToRTS(rts(a, o)))
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))
	require.Equal(t, verbs.WCRetryExcErr, poll(t, a.scq, 1)[0].Status)
	requireEmpty(t, b.rcq)
	require.Equal(t, verbs.QPStateRTS, b.qp.State())
}

// TestQueuedInlineKeepsPayload checks that an inline WR that queues behind another
// (here behind a delay) carries the payload it had when posted, whatever the source
// buffer holds later: the queue's inline storage, made when the first such WR queues,
// holds each slot's copy.
func TestQueuedInlineKeepsPayload(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	require.NoError(t, f.DelayQP(a.qp, time.Millisecond))
	payloads := []string{"first inline", "second", "third, a bit longer"}
	src := a.mr.Bytes()
	for i, p := range payloads {
		require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
		copy(src, p)
		wr := writeImm(uint64(i), a.mr, b.mr, 0, len(p))
		wr.RemoteAddr = b.mr.Addr() + uint64(64*i)
		wr.Flags |= verbs.SendInline
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}))
		copy(src, "overwritten after the post")
	}
	for _, wc := range poll(t, b.rcq, len(payloads)) {
		require.Equal(t, verbs.WCSuccess, wc.Status, "completion %d", wc.WRID)
	}
	for i, p := range payloads {
		got := string(b.mr.Bytes()[64*i:][:len(p)])
		require.Equal(t, p, got, "payload of inline write %d, queued behind a delay", i)
	}
}
