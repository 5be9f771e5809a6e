package soft_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestTeardownModels destroys a QP whose receive WRs were flushed but not polled, then
// creates another on the same CQs: with LeaveDestroyedCompletions the flushes stay in
// the CQ, and with ReuseQPNs the new QP has the destroyed one's number, so that the
// stale completions name it.
func TestTeardownModels(t *testing.T) {
	tests := []struct {
		name         string
		leave, reuse bool
		wantStale    int  // flushed completions polled after the destroy
		wantSameQPN  bool // the new QP got the old number
	}{
		{"defaults: removed, fresh numbers", false, false, 0, false},
		{"left in the CQ", true, false, 4, false},
		{"numbers reused", false, true, 0, true},
		{"left and reused: the kernel hazard", true, true, 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			f.LeaveDestroyedCompletions(tt.leave)
			f.ReuseQPNs(tt.reuse)
			s := newSide(t, f, "soft0", pairOpts{caps: verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}, cqe: 16}, 1)
			old := s.qp.QPN()
			require.NoError(t, s.qp.ToInit(verbs.InitAttr{Port: 1}))
			for i := range 4 {
				require.NoError(t, s.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
			}
			require.NoError(t, s.qp.ToError())
			require.NoError(t, s.qp.Close())

			pd := s.pd
			qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Caps: verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			require.NoError(t, err)
			defer qp.Close()
			require.Equal(t, tt.wantSameQPN, qp.QPN() == old, "new QPN %#x, destroyed %#x", qp.QPN(), old)

			wcs := make([]verbs.WorkCompletion, 16)
			n, err := s.rcq.Poll(wcs)
			require.NoError(t, err)
			require.Equal(t, tt.wantStale, n, "completions left by the destroyed QP")
			for _, wc := range wcs[:n] {
				require.Equal(t, verbs.WCWRFlushErr, wc.Status)
				require.Equal(t, old, wc.QPN, "a stale completion names the destroyed QP's number")
			}
		})
	}
}
