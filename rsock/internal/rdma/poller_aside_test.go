package rdma

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
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

// yieldingCQ is a fake CQ whose polls say they yield the processor, or not.
type yieldingCQ struct {
	*fakeCQ
	yields bool
}

func (c yieldingCQ) PollYields() bool { return c.yields }

// TestCQYields: the engine skips its own Gosched only on CQs that say their empty
// polls yield the processor now: verbs/shm's can (it has PollYields); soft's, and a
// CQ without the method or whose method says false, do not.
func TestCQYields(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer p.Close()
	ctx, err := p.Open("shm0")
	require.NoError(t, err)
	defer ctx.Close()
	shmCQ, err := ctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	defer shmCQ.Close()
	f := soft.New(soft.Options{})
	devs, err := f.Devices()
	require.NoError(t, err)
	sctx, err := f.Open(devs[0].Name)
	require.NoError(t, err)
	defer sctx.Close()
	softCQ, err := sctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	defer softCQ.Close()

	for _, tc := range []struct {
		name       string
		cq         completionQueue
		hasYielder bool
		want       bool
		provider   bool
	}{
		{name: "shm", cq: shmCQ, hasYielder: true, provider: true},
		{name: "soft", cq: softCQ},
		{name: "no PollYields", cq: newFakeCQ()},
		{name: "PollYields false", cq: yieldingCQ{newFakeCQ(), false}, hasYielder: true},
		{name: "PollYields true", cq: yieldingCQ{newFakeCQ(), true}, hasYielder: true, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &poller{cq: tc.cq, yielder: cqYielder(tc.cq)}
			require.Equal(t, tc.hasYielder, p.yielder != nil)
			if tc.provider { // shm's answer depends on the host's load: it is its own
				require.Equal(t, tc.cq.(pollYielder).PollYields(), p.yields())
				return
			}
			require.Equal(t, tc.want, p.yields())
		})
	}
}
