package rdma

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestPollerStepsAside: while a waiter holds a spinning slot, the poller's goroutine
// neither polls nor arms the CQ; the completions that arrive are the spinner's to reap
// (pollFor); once the last spinner gives its slot back, the goroutine polls again and,
// finding nothing, arms the CQ and sleeps. It runs in a synctest bubble, so "the
// goroutine waits" is decided by synctest.Wait.
func TestPollerStepsAside(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spinners int // slots taken before the goroutine starts
	}{
		{"one spinner", 1},
		{"two spinners", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cq := newFakeCQ()
				p := newFakePoller(cq, 64, 100)
				arms := func() int {
					cq.mu.Lock()
					defer cq.mu.Unlock()
					return cq.arms
				}
				for range tc.spinners {
					p.spinners.Add(1)
				}
				r := &recorder{}
				require.NoError(t, p.attach(1, r))
				synctest.Wait()
				require.Zero(t, arms(), "the goroutine armed the CQ while a waiter spins")

				cq.push(verbs.WorkCompletion{WRID: 7, QPN: 1})
				synctest.Wait()
				got, _ := r.got()
				require.Empty(t, got, "the goroutine polled while a waiter spins")
				require.Equal(t, 1, p.pollFor(1, r), "the spinner reaps for everyone")
				got, _ = r.got()
				require.Equal(t, []uint64{7}, got)

				for i := range tc.spinners {
					p.unspin()
					synctest.Wait()
					if i < tc.spinners-1 {
						require.Zero(t, arms(), "a spinner still spins")
					}
				}
				require.Equal(t, 1, arms(), "the last spinner out: the goroutine spun, armed, sleeps")
				cq.push(verbs.WorkCompletion{WRID: 8, QPN: 1})
				synctest.Wait()
				got, _ = r.got()
				require.Equal(t, []uint64{7, 8}, got, "the goroutine reaps again")

				p.detach(1)
				require.NoError(t, p.close())
			})
		})
	}
}

// TestStepAsideEndsWithContext: a goroutine stepped aside for a spinner that never
// gives its slot back still stops when its poller is stopped (the last detach).
func TestStepAsideEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ()
		p := newFakePoller(cq, 64, 100)
		p.spinners.Add(1)
		require.NoError(t, p.attach(1, &recorder{}))
		synctest.Wait()
		p.detach(1) // waits for the goroutine to exit
		require.NoError(t, p.close())
	})
}
