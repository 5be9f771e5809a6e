package rdma

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeadlineArmsOnlyForParkedWaits: a deadline closes its channel by timer only once
// a wait parked on it (parkOn); a wait that never parks learns from passed, which
// closes the channel itself. set reports when parked waits must look again.
func TestDeadlineArmsOnlyForParkedWaits(t *testing.T) {
	tests := []struct {
		name       string
		park       bool          // a wait parks on the first deadline
		then       time.Duration // a second set, from the start; 0: none
		wantWake   bool          // the second set's report
		wantClosed bool          // the channel, untouched by passed, long after
		wantPassed bool          // passed, long after
		wantTimer  bool
	}{
		{name: "never parked", wantPassed: true},
		{name: "parked", park: true, wantClosed: true, wantPassed: true, wantTimer: true},
		{name: "parked, then moved later", park: true, then: 3 * time.Second, wantWake: true, wantPassed: true, wantTimer: true},
		{name: "parked, then moved into the past", park: true, then: -time.Second, wantClosed: true, wantPassed: true, wantTimer: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var d deadline
				require.True(t, d.set(start.Add(time.Second)), "a deadline ahead wakes parked waits")
				if tt.park {
					require.NotNil(t, d.parkOn())
				}
				if tt.then != 0 {
					require.Equal(t, tt.wantWake, d.set(start.Add(tt.then)), "the second set's report")
				}
				time.Sleep(10 * time.Second)
				synctest.Wait()
				require.Equal(t, tt.wantClosed, isClosed(d.wait()), "closed by the timer or set")
				require.Equal(t, tt.wantTimer, d.timer != nil, "a timer")
				require.Equal(t, tt.wantPassed, d.passed(), "passed")
				require.Equal(t, tt.wantPassed, isClosed(d.wait()), "closed once passed said so")
			})
		})
	}
}

// TestDeadlinePassedAtItsTime: passed turns true at the deadline, not before, and a
// cleared deadline never passes.
func TestDeadlinePassedAtItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d deadline
		require.False(t, d.passed(), "no deadline")
		d.set(time.Now().Add(time.Second))
		time.Sleep(time.Second - time.Nanosecond)
		require.False(t, d.passed(), "a nanosecond early")
		time.Sleep(time.Nanosecond)
		require.True(t, d.passed(), "at its time")
		require.False(t, d.set(time.Time{}), "clearing wakes nobody")
		require.False(t, d.passed(), "cleared")
		time.Sleep(time.Hour)
		require.False(t, d.passed(), "cleared, long after")
	})
}

// TestDeadlineStaleFire calls a deadline's timer callback as a timer stopped or reset
// by set may still run it, once, for the time it was set to before: the callback acts
// only on an armed deadline in force. One moved later passes at its own time once a
// woken wait parks on it again; one cleared or already past is left as set left it.
func TestDeadlineStaleFire(t *testing.T) {
	tests := []struct {
		name     string
		then     time.Duration // the second set, from the start; 0 clears, negative is past
		wantOpen bool          // the channel after the stale fire at one second
		passes   bool          // the channel is closed long after, by the timer
	}{
		{name: "moved later", then: 3 * time.Second, wantOpen: true, passes: true},
		{name: "cleared", then: 0, wantOpen: true},
		{name: "moved into the past", then: -time.Second, wantOpen: false, passes: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var d deadline
				d.set(start.Add(time.Second))
				d.parkOn()
				var to time.Time
				if tt.then != 0 {
					to = start.Add(tt.then)
				}
				d.set(to)
				time.Sleep(time.Second) // (synctest's clock) where the first deadline was
				d.fire()                // as the first arming's callback, already under way, would
				require.Equal(t, tt.wantOpen, !isClosed(d.wait()), "after the stale callback")
				d.parkOn() // the wait that set woke parks again
				time.Sleep(10 * time.Second)
				synctest.Wait()
				require.Equal(t, tt.passes, isClosed(d.wait()), "long after")
			})
		})
	}
}

// TestDeadlineMovedAlong moves one deadline ahead many times, as a server does per
// request, with a wait parked on each: it passes at the last time it was given, and
// one timer serves all of them.
func TestDeadlineMovedAlong(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d deadline
		var first *time.Timer
		for i := range 100 {
			d.set(time.Now().Add(time.Second))
			d.parkOn()
			if i == 0 {
				first = d.timer
			}
			time.Sleep(time.Second / 2)
			require.False(t, isClosed(d.wait()), "passed before its time")
		}
		require.NotNil(t, first)
		require.Same(t, first, d.timer, "a new timer for a moved deadline")
		time.Sleep(time.Second)
		synctest.Wait()
		require.True(t, isClosed(d.wait()), "the last deadline passed")
		d.set(time.Time{})
		require.False(t, isClosed(d.wait()), "cleared: a fresh channel")
	})
}
