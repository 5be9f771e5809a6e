package verbstest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testErrorFlush: moving a QP to ERROR completes every outstanding WR with WR_FLUSH_ERR,
// in order, on both queues, unsignaled WRs included.
func testErrorFlush(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	postRecvs(t, a.qp, 20, 3)
	post(t, a.qp,
		sendWR(1, a.mr, 0, 8, verbs.SendSignaled), // stalls: b has no receive WQE
		writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, 0),
		sendWR(3, a.mr, 0, 8, 0),
		writeWR(4, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled),
	)
	requireEmpty(t, a.scq, "WRs behind a stalled SEND")
	require.NoError(t, a.qp.ToError())
	require.Equal(t, verbs.QPStateError, a.qp.State())
	for i, wc := range pollN(t, a.scq, 4) {
		requireWC(t, wc, uint64(i+1), verbs.WCWRFlushErr)
		require.Equal(t, a.qp.QPN(), wc.QPN)
	}
	for i, wc := range pollN(t, a.rcq, 3) {
		requireWC(t, wc, uint64(20+i), verbs.WCWRFlushErr)
	}
	requireEmpty(t, a.scq, "after the flush")
	require.Equal(t, verbs.QPStateRTS, b.qp.State(), "peer of a QP moved to ERROR")
	requireEmpty(t, b.rcq, "peer of a flushed QP")
}

// testPostInErrorFlushes: work requests posted to a QP in ERROR are accepted and complete
// with WR_FLUSH_ERR, signaled or not. rxe flushes a QP's queues only as the QP enters
// ERROR (never again on kernel 6.1; on 6.12 only if its completer has not finished yet);
// verbs/ibv makes up for it, so the rule holds on both.
func testPostInErrorFlushes(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	require.NoError(t, a.qp.ToError())
	post(t, a.qp,
		writeWR(1, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, 0),
		writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled),
	)
	postRecvs(t, a.qp, 10, 2)
	wcs := pollN(t, a.scq, 2)
	requireWC(t, wcs[0], 1, verbs.WCWRFlushErr)
	requireWC(t, wcs[1], 2, verbs.WCWRFlushErr)
	rwcs := pollN(t, a.rcq, 2)
	requireWC(t, rwcs[0], 10, verbs.WCWRFlushErr)
	requireWC(t, rwcs[1], 11, verbs.WCWRFlushErr)
	require.Equal(t, make([]byte, 8), b.mr.Bytes()[:8], "flushed write executed")
}

// testDeadPeer: requests to a peer that is gone or not ready are lost; the requester
// retransmits, then completes with RETRY_EXC_ERR and moves to ERROR.
func testDeadPeer(t *testing.T, p providers) {
	cases := []struct {
		name string
		kill func(t *testing.T, b *endpoint)
	}{
		{"Destroyed", func(t *testing.T, b *endpoint) {
			require.NoError(t, b.qp.Close())
			b.qp = nil
		}},
		{"Reset", func(t *testing.T, b *endpoint) { require.NoError(t, b.qp.ToReset()) }},
		{"Error", func(t *testing.T, b *endpoint) { require.NoError(t, b.qp.ToError()) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPair(t, p, defaults())
			tc.kill(t, b)
			post(t, a.qp,
				writeWR(1, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled),
				writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, 0),
			)
			wcs := pollN(t, a.scq, 2)
			requireWC(t, wcs[0], 1, verbs.WCRetryExcErr)
			requireWC(t, wcs[1], 2, verbs.WCWRFlushErr)
			waitState(t, a.qp, verbs.QPStateError)
			require.Equal(t, make([]byte, 8), b.mr.Bytes()[:8], "write to a dead peer executed")
		})
	}

	t.Run("NeverConnected", func(t *testing.T) {
		cfg := defaults()
		a := newEndpoint(t, p, 0, "a", cfg)
		b := newEndpoint(t, p, 1, "b", cfg)
		a.toInit()
		b.toInit() // b stays in INIT: it drops what it is sent
		a.toRTR(b)
		a.toRTS()
		post(t, a.qp, writeWR(1, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
		requireWC(t, pollOne(t, a.scq), 1, verbs.WCRetryExcErr)
		waitState(t, a.qp, verbs.QPStateError)
	})
}
