package rdma

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestDeferredNudge: the last spinner to leave hands the CQ back to the standing-by
// goroutine at once only when a waiter is parked; otherwise the nudge waits for a
// waiter that parks, a new spinner (which takes the polling over and owes nothing), or
// the late timer, within two nudgeGraces. "Dispatched" is what the goroutine reaps once
// nudged; in a synctest bubble, synctest.Wait without a sleep means "at once".
func TestDeferredNudge(t *testing.T) {
	tests := []struct {
		name string
		// before runs before the last spinner leaves, then after, the goroutine
		// standing by either way.
		before, then   func(p *poller)
		wantAtOnce     bool // dispatched with no time passing
		wantAfterGrace bool // dispatched once two nudgeGraces passed
	}{
		{
			name:           "nobody waits: after the grace",
			then:           func(*poller) {},
			wantAfterGrace: true,
		},
		{
			name:           "a waiter parks",
			then:           func(p *poller) { p.parking() },
			wantAtOnce:     true,
			wantAfterGrace: true,
		},
		{
			name: "a new spinner takes over, and spins on",
			then: func(p *poller) {
				require.Positive(t, (&Conn{poll: p}).beginSpin(false))
			},
		},
		{
			name: "a new spinner takes over, then a waiter parks",
			then: func(p *poller) {
				require.Positive(t, (&Conn{poll: p}).beginSpin(false))
				p.parking() // the spinner polls for it: no nudge
			},
		},
		{
			name: "a new spinner takes over, then leaves",
			then: func(p *poller) {
				require.Positive(t, (&Conn{poll: p}).beginSpin(false))
				time.Sleep(nudgeGrace) // the first deferral's grace: paid by the take-over
				synctest.Wait()
				p.endSpin() // a deferral of its own
			},
			wantAfterGrace: true,
		},
		{
			name: "a waiter parked and woke before the spinner left",
			before: func(p *poller) {
				p.parking()
				p.unparked()
			},
			then:           func(*poller) {},
			wantAfterGrace: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, cq, rec := standingBy(t)
				if tc.before != nil {
					tc.before(p)
				}
				p.endSpin()
				tc.then(p)
				synctest.Wait()
				got, _ := rec.got()
				require.Equal(t, tc.wantAtOnce, len(got) == 1, "dispatched at once")
				time.Sleep(2 * nudgeGrace)
				synctest.Wait()
				got, _ = rec.got()
				require.Equal(t, tc.wantAfterGrace, len(got) == 1, "dispatched after the grace")
				cq.mu.Lock()
				require.Equal(t, tc.wantAfterGrace, len(cq.queue) == 0, "completions left in the CQ")
				cq.mu.Unlock()
				p.detach(1)
				require.NoError(t, p.close())
			})
		})
	}
}

// TestLateNudgeSpaced: a deferred nudge is not paid before nudgeGrace, and spinners
// that come and go faster than that are never interrupted by one, however long they
// keep at it (the late timer is not reset per deferral, and looks again instead); once
// they stop, the last deferral is paid within two nudgeGraces.
func TestLateNudgeSpaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _, rec := standingBy(t)
		dispatched := func() bool {
			synctest.Wait()
			got, _ := rec.got()
			return len(got) > 0
		}
		p.endSpin()
		time.Sleep(nudgeGrace - time.Nanosecond)
		require.False(t, dispatched(), "paid before nudgeGrace")
		require.Positive(t, (&Conn{poll: p}).beginSpin(false))
		// Eight nudgeGraces of waiters that spin briefly and leave for longer: the
		// timer, when it looks, finds a deferral owed, younger than nudgeGrace.
		spinFor, away := nudgeGrace*12/1000, nudgeGrace*85/1000
		for range 80 {
			time.Sleep(spinFor)
			p.endSpin()
			time.Sleep(away)
			require.Positive(t, (&Conn{poll: p}).beginSpin(false))
		}
		require.False(t, dispatched(), "the goroutine nudged while waiters kept spinning")
		p.endSpin()
		require.False(t, dispatched(), "paid at once")
		time.Sleep(2 * nudgeGrace)
		require.True(t, dispatched(), "not paid within two nudgeGraces")
		p.detach(1)
		require.NoError(t, p.close())
	})
}

// TestNudgeAtOnceWhenParked: a spinner that leaves while a waiter is parked nudges the
// goroutine at once, and a parked count left behind (a park never uncounted) keeps
// every nudge immediate, as before deferral.
func TestNudgeAtOnceWhenParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _, rec := standingBy(t)
		p.parking()
		p.endSpin()
		synctest.Wait()
		got, _ := rec.got()
		require.Len(t, got, 1, "dispatched at once")
		require.False(t, p.owed.Load(), "a nudge still owed")
		p.detach(1)
		require.NoError(t, p.close())
	})
}

// requireParkedWhile runs wait, which must park on c, in a synctest bubble: once
// everything is blocked it requires c's poller to count one waiter parked, then fails
// c, and requires wait to end with that failure and the count back to zero.
func requireParkedWhile(t *testing.T, c *Conn, what string, wait func() error) {
	t.Helper()
	parked := make(chan int32, 1)
	go func() {
		synctest.Wait()
		parked <- c.poll.parked.Load()
		c.mu.Lock()
		c.failLocked(errTestDone)
		c.mu.Unlock()
	}()
	require.ErrorIs(t, wait(), errTestDone)
	require.Equal(t, int32(1), <-parked, "parked while %s waited", what)
	require.Zero(t, c.poll.parked.Load(), "parked after %s", what)
}

// TestParkedWaitersCounted: every wait of a Conn that parks on what the poller's
// dispatch signals counts itself parked while it waits, and no longer after: a Read, a
// Write, a wait for the peer's proof.
func TestParkedWaitersCounted(t *testing.T) {
	t.Run("read", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, _, _ := pollingConn(t, 0)
			requireParkedWhile(t, c, "the Read", func() error {
				_, err := c.Read(make([]byte, 8))
				return err
			})
		})
	})
	t.Run("write", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, _, _ := pollingConn(t, 0)
			for range fakeSQDepth - 1 { // fill the send queue: the next Write waits
				_, err := c.Write([]byte{1})
				require.NoError(t, err)
			}
			requireParkedWhile(t, c, "the Write", func() error {
				_, err := c.Write([]byte{1})
				return err
			})
		})
	})
	t.Run("proof", func(t *testing.T) {
		c, _, _ := pollingConn(t, 0)
		c.ProofDone()
		c.OnProof(ProofFunc(func() {}))
		require.Equal(t, int32(1), c.poll.parked.Load(), "parked while the proof is awaited, once")
		c.mu.Lock()
		c.finishProofLocked(0, errTestDone)
		c.mu.Unlock()
		require.Zero(t, c.poll.parked.Load(), "parked after the proof's wait ended")
		c.ProofDone()
		require.Zero(t, c.poll.parked.Load(), "a wait over counts nothing")
	})
}

// standingBy returns a poller whose goroutine stands by for a waiter that holds the
// only spinning slot, a completion of QP 1 left in the CQ for the waiter's polls, and
// the recorder that QP 1's completions reach.
func standingBy(t *testing.T) (*poller, *fakeCQ, *recorder) {
	t.Helper()
	cq := newFakeCQ()
	p := newFakePoller(cq, 64, 100)
	rec := &recorder{}
	require.NoError(t, p.attach(1, rec))
	synctest.Wait() // asleep on the channel
	require.Positive(t, (&Conn{poll: p}).beginSpin(false))
	cq.push(verbs.WorkCompletion{WRID: 1, QPN: 1}) // wakes it, and it stands by
	synctest.Wait()
	require.True(t, p.standby.Load(), "standing by")
	cq.push(verbs.WorkCompletion{WRID: 2, QPN: 1})
	synctest.Wait()
	got, _ := rec.got()
	require.Equal(t, []uint64{1}, got)
	rec.mu.Lock()
	rec.wrids = nil
	rec.mu.Unlock()
	return p, cq, rec
}

// errTestDone fails a Conn to end a test's wait.
var errTestDone = errors.New("test over")
