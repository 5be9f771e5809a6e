package verbstest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testRNRRetryExceeded: a SEND or WRITE_WITH_IMM that finds no receive WQE is retried
// rnr_retry times; then it completes with RNR_RETRY_EXC_ERR, the requester moves to ERROR
// and the WRs behind it are flushed. The responder is unharmed.
func testRNRRetryExceeded(t *testing.T, p verbs.Provider) {
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

// testRNRRetryForever: with rnr_retry 7 the requester retries for as long as it takes, and
// the request completes once a receive WQE is posted.
func testRNRRetryForever(t *testing.T, p verbs.Provider) {
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
			fill(a.mr.Bytes()[:16], 9)
			post(t, a.qp, writeWR(1, a.mr, 0, 16, b.mr, 0, tc.op, verbs.SendSignaled))
			// Far longer than seven RNR timers (7 × 0.64 ms): a provider that stopped
			// after seven retries would have failed the request by now.
			time.Sleep(60 * time.Millisecond)
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
