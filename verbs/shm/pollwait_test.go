package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestSpinPoll: an empty poll looks again until something is found, emptyPollWait has
// passed on the clock, or emptyPollLooks looks were made (a clock that stands still).
func TestSpinPoll(t *testing.T) {
	for _, tc := range []struct {
		name      string
		step      time.Duration // the clock's advance per look
		foundAt   int           // the look that finds something; 0: none does
		wantLooks int
		wantFound bool
	}{
		{"found at once", time.Microsecond, 1, 1, true},
		{"found while waiting", 100 * time.Nanosecond, 5, 5, true},
		{"found at the last look", emptyPollWait / 4, 5, 5, true},
		{"nothing within the wait", emptyPollWait / 4, 0, 5, false},
		{"a clock that jumps past the wait", time.Hour, 0, 2, false},
		{"a clock that stands still", 0, 0, emptyPollLooks, false},
		{"found on a clock that stands still", 0, emptyPollLooks, emptyPollLooks, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock time.Duration
			looks := 0
			found := spinPoll(func() time.Duration { return clock }, func() bool {
				looks++
				clock += tc.step
				return looks == tc.foundAt
			})
			require.Equal(t, tc.wantFound, found)
			require.Equal(t, tc.wantLooks, looks)
		})
	}
}

// TestEmptyPollAllocatesNothing: the wait of an empty Poll, with QPs feeding the CQ
// through their rings, allocates nothing.
func TestEmptyPollAllocatesNothing(t *testing.T) {
	p := newProvider(t, 2)
	a := newEnd(t, p, "shm0", 4096)
	b := newEnd(t, p, "shm1", 4096)
	connectEnds(t, a, b, 14, 7)
	wc := make([]verbs.WorkCompletion, 4)
	allocs := testing.AllocsPerRun(100, func() {
		n, err := a.cq.Poll(wc)
		if n != 0 || err != nil {
			t.Fatalf("poll of an idle CQ: %d completions, %v", n, err)
		}
	})
	require.Zero(t, allocs)
}
