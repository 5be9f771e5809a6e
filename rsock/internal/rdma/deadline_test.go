package rdma

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeadlineStaleFire calls a deadline's timer callback as a timer stopped or reset
// by set may still run it, once, for the time it was set to before: the callback acts
// only on the deadline in force. One moved later is waited for again and passes at its
// own time; one cleared or already past is left as set left it.
func TestDeadlineStaleFire(t *testing.T) {
	tests := []struct {
		name     string
		then     time.Duration // the second set, from the start; 0 clears, negative is past
		wantOpen bool          // the channel after the stale fire at one second
		passesAt time.Duration // when the channel is closed after all; 0: never
	}{
		{name: "moved later", then: 3 * time.Second, wantOpen: true, passesAt: 3 * time.Second},
		{name: "cleared", then: 0, wantOpen: true},
		{name: "moved into the past", then: -time.Second, wantOpen: false, passesAt: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var d deadline
				require.True(t, d.set(start.Add(time.Second)), "the first deadline makes the channel")
				var to time.Time
				if tt.then != 0 {
					to = start.Add(tt.then)
				}
				d.set(to)
				time.Sleep(time.Second) // (synctest's clock) where the first deadline was
				d.fire()                // as the first arming's callback, already under way, would
				require.Equal(t, tt.wantOpen, !isClosed(d.wait()), "after the stale callback")
				time.Sleep(10 * time.Second)
				synctest.Wait()
				require.Equal(t, tt.passesAt != 0, isClosed(d.wait()), "long after")
			})
		})
	}
}

// TestDeadlineMovedAlong moves one deadline ahead many times, as a server does per
// request: it passes at the last time it was given, and one timer serves all of them.
func TestDeadlineMovedAlong(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d deadline
		for range 100 {
			d.set(time.Now().Add(time.Second))
			time.Sleep(time.Second / 2)
			require.False(t, isClosed(d.wait()), "passed before its time")
		}
		first := d.timer
		d.set(time.Now().Add(time.Second))
		require.Same(t, first, d.timer, "a new timer for a moved deadline")
		time.Sleep(time.Second)
		synctest.Wait()
		require.True(t, isClosed(d.wait()), "the last deadline passed")
		d.set(time.Time{})
		require.False(t, isClosed(d.wait()), "cleared: a fresh channel")
	})
}
