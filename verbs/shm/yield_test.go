package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeHost is a yielder on a clock the test moves, whose yields take the time the
// test sets.
type fakeHost struct {
	t      time.Duration
	cost   time.Duration // how long the next yields take
	yields int
}

func (h *fakeHost) yielder() *yielder {
	return &yielder{
		now:   func() time.Duration { return h.t },
		yield: func() { h.yields++; h.t += h.cost },
	}
}

// TestYieldPolicy: every call yields while yields are quick; one slow yield makes the
// host contended for contendedFor, during which only every contendedEvery-th call
// yields; after it, every call yields again, until the next slow one.
func TestYieldPolicy(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cost      time.Duration // of every yield
		calls     int
		wantYield int
		contended bool // afterwards
	}{
		{"quick yields", time.Microsecond, 100, 100, false},
		{"yields at the threshold", slowYield, 100, 100, false},
		{"one slow yield, then few", slowYield + 1, 1 + 8*contendedEvery, 1 + 8, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &fakeHost{cost: tc.cost}
			y := h.yielder()
			for range tc.calls {
				y.yieldCPU()
			}
			require.Equal(t, tc.wantYield, h.yields)
			require.Equal(t, tc.contended, y.contendedAt(h.t))
		})
	}
}

// TestYieldContentionEnds: contendedFor after the slow yield, the host is taken as
// free again and every call yields, each measured anew.
func TestYieldContentionEnds(t *testing.T) {
	h := &fakeHost{cost: time.Millisecond}
	y := h.yielder()
	y.yieldCPU()
	require.True(t, y.contendedAt(h.t))
	h.cost = time.Microsecond
	h.t += contendedFor - 1
	require.True(t, y.contendedAt(h.t), "still within contendedFor")
	h.t++
	require.False(t, y.contendedAt(h.t))
	before := h.yields
	for range 10 {
		y.yieldCPU()
	}
	require.Equal(t, before+10, h.yields)
	require.False(t, y.contendedAt(h.t))
}

// TestPollYieldsFollowsHost: a CQ tells spinners it yields unless the process's host
// yielder has seen contention.
func TestPollYieldsFollowsHost(t *testing.T) {
	saved := host.busyUntil.Load()
	defer host.busyUntil.Store(saved)
	var c CQ
	host.busyUntil.Store(0)
	require.True(t, c.PollYields())
	host.busyUntil.Store(int64(host.now() + time.Hour))
	require.False(t, c.PollYields())
}
