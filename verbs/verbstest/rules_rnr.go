package verbstest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testRNRRetryExceeded: a SEND or WRITE_WITH_IMM that finds no receive WQE is retried
// rnr_retry times; then it completes with RNR_RETRY_EXC_ERR, the requester moves to ERROR
// and the WRs behind it are flushed. The responder is unharmed.
func testRNRRetryExceeded(t *testing.T, p providers) {
	cases := []struct {
		name     string
		op       verbs.Opcode
		rnrRetry uint8
	}{
		{"Send", verbs.OpSend, 2},
		{"SendWithImm", verbs.OpSendWithImm, 2},
		{"WriteWithImm", verbs.OpRDMAWriteWithImm, 2},
		{"SendNoRetry", verbs.OpSend, 0},
		{"WriteWithImmNoRetry", verbs.OpRDMAWriteWithImm, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaults()
			cfg.rnrRetry = tc.rnrRetry
			a, b := newPair(t, p, cfg)
			wr := writeWR(1, a.mr, 0, 16, b.mr, 0, tc.op, verbs.SendSignaled)
			post(t, a.qp, wr, writeWR(2, a.mr, 0, 16, b.mr, 512, verbs.OpRDMAWrite, 0))
			wcs := pollN(t, a.scq, 2)
			requireWC(t, wcs[0], 1, verbs.WCRNRRetryExcErr)
			requireWC(t, wcs[1], 2, verbs.WCWRFlushErr)
			waitState(t, a.qp, verbs.QPStateError)
			require.Equal(t, verbs.QPStateRTS, b.qp.State(), "responder after RNR")
			requireEmpty(t, b.rcq, "responder without receive WQEs")
		})
	}
}

// witnessRNRTimer is the RNR timer (10.24 ms) of testRNRRetryForever's witness: 16 times
// rnrTimer (0.64 ms).
const witnessRNRTimer = 20

// testRNRRetryForever: with rnr_retry 7 the requester retries for as long as it takes, and
// the request completes once a receive WQE is posted.
//
// That the request is still waiting after more than seven RNR retries is checked once a
// witness has decided it, not after a sleep: a second pair, whose requester has rnr_retry
// 6 and whose responder asks for an RNR timer 16 times as long (10.24 ms against 0.64 ms),
// is stalled the same way; when the witness fails with RNR_RETRY_EXC_ERR, at least six of
// its long timers have passed, time for some 96 of the first pair's (and still 18 at a
// 4 ms timer tick, as rxe's): a provider that stopped after seven retries has failed the
// request by then.
func testRNRRetryForever(t *testing.T, p providers) {
	cases := []struct {
		name string
		op   verbs.Opcode
	}{
		{"Send", verbs.OpSend},
		{"WriteWithImm", verbs.OpRDMAWriteWithImm},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaults()
			cfg.rnrRetry = 7
			a, b := newPair(t, p, cfg)
			wcfg := defaults()
			wcfg.rnrRetry = 6
			wrcfg := wcfg
			wrcfg.rnrTimer = witnessRNRTimer
			wa, wb := newPair(t, p, wcfg, wrcfg)
			fill(a.mr.Bytes()[:16], 9)
			post(t, a.qp, writeWR(1, a.mr, 0, 16, b.mr, 0, tc.op, verbs.SendSignaled))
			post(t, wa.qp, writeWR(1, wa.mr, 0, 16, wb.mr, 0, tc.op, verbs.SendSignaled))
			requireWC(t, pollOne(t, wa.scq), 1, verbs.WCRNRRetryExcErr)
			requireEmpty(t, a.scq, "request waiting for a receive WQE")
			require.Equal(t, verbs.QPStateRTS, a.qp.State())

			postRecv(t, b.qp, verbs.RecvWR{ID: 7, SGL: []verbs.SGE{sge(b.mr, 0, 64)}})
			requireWC(t, pollOne(t, a.scq), 1, verbs.WCSuccess)
			wc := pollOne(t, b.rcq)
			requireWC(t, wc, 7, verbs.WCSuccess)
			require.Equal(t, uint32(16), wc.ByteLen)
			require.Equal(t, a.mr.Bytes()[:16], b.mr.Bytes()[:16])
		})
	}
}
