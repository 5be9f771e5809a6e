package verbstest

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testSendWithImmScatter: a SEND_WITH_IMM is scattered over the receive WQE's buffers in
// order, and its completion carries the immediate and the length.
func testSendWithImmScatter(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	postRecv(t, b.qp, verbs.RecvWR{ID: 3, SGL: []verbs.SGE{sge(b.mr, 1000, 60), sge(b.mr, 5000, 60)}})
	fill(a.mr.Bytes()[:100], 6)
	wr := sendWR(1, a.mr, 0, 100, verbs.SendSignaled)
	wr.Opcode, wr.Imm = verbs.OpSendWithImm, 0xdeadbeef
	post(t, a.qp, wr)
	wc := pollOne(t, a.scq)
	requireWC(t, wc, 1, verbs.WCSuccess)
	require.Equal(t, verbs.WCSend, wc.Opcode)
	wc = pollOne(t, b.rcq)
	requireWC(t, wc, 3, verbs.WCSuccess)
	require.Equal(t, verbs.WCRecv, wc.Opcode)
	require.Equal(t, uint32(100), wc.ByteLen)
	require.Equal(t, uint32(0xdeadbeef), wc.Imm)
	require.NotZero(t, wc.Flags&verbs.WCWithImm, "WCWithImm flag")
	require.Equal(t, b.qp.QPN(), wc.QPN)
	require.Equal(t, a.mr.Bytes()[:60], b.mr.Bytes()[1000:1060])
	require.Equal(t, a.mr.Bytes()[60:100], b.mr.Bytes()[5000:5040])
}

// testZeroLengthRecv: a receive WQE without buffers takes a zero-length SEND and a
// zero-length WRITE_WITH_IMM (whose rkey is not checked).
func testZeroLengthRecv(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	postRecvs(t, b.qp, 1, 2)
	post(t, a.qp,
		sendWR(10, a.mr, 0, 0, verbs.SendSignaled),
		verbs.SendWR{ID: 11, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 77},
	)
	wcs := pollN(t, a.scq, 2)
	requireWC(t, wcs[0], 10, verbs.WCSuccess)
	requireWC(t, wcs[1], 11, verbs.WCSuccess)
	rwcs := pollN(t, b.rcq, 2)
	requireWC(t, rwcs[0], 1, verbs.WCSuccess)
	require.Equal(t, verbs.WCRecv, rwcs[0].Opcode)
	require.Zero(t, rwcs[0].ByteLen)
	requireWC(t, rwcs[1], 2, verbs.WCSuccess)
	require.Equal(t, verbs.WCRecvRDMAWithImm, rwcs[1].Opcode)
	require.Zero(t, rwcs[1].ByteLen)
	require.Equal(t, uint32(77), rwcs[1].Imm)
}

// testInlineSend: inline data is taken at post time, so the buffer may be reused as soon
// as PostSend returns even though the WR has not executed; inline data beyond the QP's
// limit is refused at post time.
func testInlineSend(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	src := a.mr.Bytes()[:48]
	fill(src, 8)
	want := bytes.Clone(src)
	// No receive WQE yet: the SEND waits in RNR retries while its buffer is overwritten.
	post(t, a.qp, sendWR(1, a.mr, 0, 48, verbs.SendSignaled|verbs.SendInline))
	fill(src, 9)
	wr := writeWR(2, a.mr, 0, 48, b.mr, 4096, verbs.OpRDMAWrite, verbs.SendSignaled|verbs.SendInline)
	post(t, a.qp, wr)
	fill(src, 10)
	postRecv(t, b.qp, verbs.RecvWR{ID: 5, SGL: []verbs.SGE{sge(b.mr, 0, 64)}})
	requireWC(t, pollOne(t, b.rcq), 5, verbs.WCSuccess)
	wcs := pollN(t, a.scq, 2)
	requireWC(t, wcs[0], 1, verbs.WCSuccess)
	requireWC(t, wcs[1], 2, verbs.WCSuccess)
	require.Equal(t, want, b.mr.Bytes()[:48], "inline SEND payload")
	fill(want, 9)
	require.Equal(t, want, b.mr.Bytes()[4096:4096+48], "inline WRITE payload")

	limit := len(a.mr.Bytes()) - 1 // more than any device inlines
	if c, ok := a.qp.(CapsReporter); ok {
		limit = c.Caps().MaxInlineData
		// Exactly the limit is accepted.
		post(t, a.qp, writeWR(3, a.mr, 0, limit, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled|verbs.SendInline))
		requireWC(t, pollOne(t, a.scq), 3, verbs.WCSuccess)
	}
	err := a.qp.PostSend([]verbs.SendWR{writeWR(4, a.mr, 0, limit+1, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled|verbs.SendInline)})
	requirePostError(t, err, 0, nil)
	requireEmpty(t, a.scq, "refused inline WR")
}

// testRDMARead: an RDMA READ copies remote memory into the local buffers, in order.
func testRDMARead(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	fillMR(t, b.mr, 8192, 5000, 11)
	wr := verbs.SendWR{
		ID: 1, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGL:        []verbs.SGE{sge(a.mr, 0, 3000), sge(a.mr, 10000, 2000)},
		RemoteAddr: b.mr.Addr() + 8192, RKey: b.mr.RKey(),
	}
	post(t, a.qp, wr)
	wc := pollOne(t, a.scq)
	requireWC(t, wc, 1, verbs.WCSuccess)
	require.Equal(t, verbs.WCRDMARead, wc.Opcode)
	remote := readBytes(t, b.mr, 8192, 5000)
	require.Equal(t, remote[:3000], a.mr.Bytes()[:3000])
	require.Equal(t, remote[3000:], a.mr.Bytes()[10000:12000])
	requireEmpty(t, b.rcq, "an RDMA READ consumes no receive WQE")
}

// testCompChannelWait: an armed CQ produces an event on its channel when a completion
// arrives; Wait returns that CQ, and returns ctx.Err() when its context ends first.
func testCompChannelWait(t *testing.T, p providers) {
	cfg := defaults()
	cfg.channel = true
	a, b := newPair(t, p, cfg)
	postRecvs(t, b.qp, 1, 2)
	require.NoError(t, b.rcq.ReqNotify(false))
	requireEmpty(t, b.rcq, "poll after arming")

	type result struct {
		cq  verbs.CQ
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		cq, err := b.ch.Wait(ctx)
		got <- result{cq, err}
	}()
	post(t, a.qp, writeWR(1, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
	r := <-got
	require.NoError(t, r.err)
	require.True(t, r.cq == b.rcq, "Wait returned %v, want the receive CQ %v", r.cq, b.rcq)
	requireWC(t, pollOne(t, b.rcq), 1, verbs.WCSuccess)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.ch.Wait(ctx)
	require.ErrorIs(t, err, context.Canceled)

	// Armed again, the next completion produces one event.
	require.NoError(t, b.rcq.ReqNotify(false))
	post(t, a.qp, writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
	wctx, wcancel := context.WithTimeout(context.Background(), waitLimit)
	defer wcancel()
	cq, err := b.ch.Wait(wctx)
	require.NoError(t, err)
	require.True(t, cq == b.rcq)
	requireWC(t, pollOne(t, b.rcq), 2, verbs.WCSuccess)
}

// testCompChannelSolicitedOnly: a CQ armed for solicited completions stays quiet for an
// unsolicited one and produces an event for a solicited one.
//
// The quiet is checked once it is decided, not by waiting a while for no event: the
// unsolicited completion is polled first (so it was added, and any event it caused was
// queued), then a completion on a witness CQ of the same channel, armed for any completion,
// queues an event. Events leave a channel in the order they were queued, so the first event
// must be the witness's.
func testCompChannelSolicitedOnly(t *testing.T, p providers) {
	cfg := defaults()
	cfg.channel = true
	a, b := newPair(t, p, cfg)
	postRecvs(t, b.qp, 1, 2)
	require.NoError(t, b.rcq.ReqNotify(true))
	require.NoError(t, b.scq.ReqNotify(false))
	post(t, a.qp, writeWR(1, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 1, verbs.WCSuccess)
	requireWC(t, pollOne(t, b.rcq), 1, verbs.WCSuccess)

	post(t, b.qp, writeWR(9, b.mr, 0, 8, a.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
	requireWC(t, pollOne(t, b.scq), 9, verbs.WCSuccess)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	cq, err := b.ch.Wait(ctx)
	require.NoError(t, err)
	require.True(t, cq == b.scq, "first event on the channel from %v, want the witness CQ %v: an event for an unsolicited completion", cq, b.scq)

	post(t, a.qp, writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled|verbs.SendSolicited))
	cq, err = b.ch.Wait(ctx)
	require.NoError(t, err)
	require.True(t, cq == b.rcq, "event from %v, want the receive CQ %v", cq, b.rcq)
	requireWC(t, pollOne(t, b.rcq), 2, verbs.WCSuccess)
	requireWC(t, pollOne(t, a.scq), 2, verbs.WCSuccess)
}
