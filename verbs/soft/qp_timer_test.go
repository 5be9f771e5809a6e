package soft

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// newTimerTestQP returns a QP in INIT on a new fabric, with its receive CQ, all
// destroyed when the test ends.
func newTimerTestQP(t *testing.T) (*QP, verbs.CQ) {
	t.Helper()
	f := New(Options{})
	devs, err := f.Devices()
	require.NoError(t, err)
	ctx, err := f.Open(devs[0].Name)
	require.NoError(t, err)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	scq, err := ctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	rcq, err := ctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq,
		Caps: verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{qp, scq, rcq, pd, ctx} {
			require.NoError(t, c.Close())
		}
	})
	require.NoError(t, qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite}))
	return qp.(*QP), rcq
}

// TestQPTimerMadeOnDemand checks that a QP makes its timer only when first needed: a
// new QP has none, nor does ToReset or Close need one; a fatal error makes it, and it
// drives that error's flush of the receive queue; first uses that race share one timer.
func TestQPTimerMadeOnDemand(t *testing.T) {
	tests := []struct {
		name    string
		use     func(t *testing.T, q *QP)
		want    bool // the QP has a timer after use
		flushes bool // the posted receive completes with WR_FLUSH_ERR
	}{
		{"new", func(*testing.T, *QP) {}, false, false},
		{"reset", func(t *testing.T, q *QP) { require.NoError(t, q.ToReset()) }, false, false},
		{"fatal error", func(_ *testing.T, q *QP) { q.fail() }, true, true},
		{"racing first uses", func(t *testing.T, q *QP) {
			var wg sync.WaitGroup
			timers := make([]*time.Timer, 8)
			for i := range timers {
				wg.Go(func() { timers[i] = q.sqTimer() })
			}
			wg.Wait()
			for i, tm := range timers {
				require.Same(t, q.timer.Load(), tm, "sqTimer's timer in goroutine %d", i)
			}
		}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q, rcq := newTimerTestQP(t)
				require.NoError(t, q.PostRecv([]verbs.RecvWR{{ID: 7}}))
				tt.use(t, q)
				synctest.Wait() // a timer reset to fire at once has run
				require.Equal(t, tt.want, q.timer.Load() != nil, "the QP has a timer after %s", tt.name)
				var wc [2]verbs.WorkCompletion
				n, err := rcq.Poll(wc[:])
				require.NoError(t, err)
				if !tt.flushes {
					require.Zero(t, n, "completions after %s: %v", tt.name, wc[:n])
					return
				}
				require.Equal(t, 1, n, "completions after %s: %v", tt.name, wc[:n])
				require.Equal(t, verbs.WCWRFlushErr, wc[0].Status, "the posted receive, after %s", tt.name)
			})
		})
	}
}
