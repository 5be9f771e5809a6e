package cpuyield

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeHost is a yielder on a clock the test moves, whose yields take the time the
// test sets.
type fakeHost struct {
	t      time.Duration
	cost   time.Duration // how long the next yields take
	yields int
}

func (h *fakeHost) yielder() *Yielder {
	return New(func() time.Duration { return h.t }, func() { h.yields++; h.t += h.cost })
}

// TestYieldPolicy: every call yields while yields are quick; one slow yield makes the
// host contended for ContendedFor, during which only every ContendedEvery-th call
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
		{"yields at the threshold", SlowYield, 100, 100, false},
		{"one slow yield, then few", SlowYield + 1, 1 + 8*ContendedEvery, 1 + 8, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &fakeHost{cost: tc.cost}
			y := h.yielder()
			for range tc.calls {
				y.Yield()
			}
			require.Equal(t, tc.wantYield, h.yields)
			require.Equal(t, tc.contended, y.Contended())
		})
	}
}

// TestYieldContentionEnds: ContendedFor after the slow yield, the host is taken as
// free again and every call yields, each measured anew.
func TestYieldContentionEnds(t *testing.T) {
	h := &fakeHost{cost: time.Millisecond}
	y := h.yielder()
	y.Yield()
	require.True(t, y.Contended())
	h.cost = time.Microsecond
	h.t += ContendedFor - 1
	require.True(t, y.Contended(), "still within ContendedFor")
	h.t++
	require.False(t, y.Contended())
	before := h.yields
	for range 10 {
		y.Yield()
	}
	require.Equal(t, before+10, h.yields)
	require.False(t, y.Contended())
}

// TestSetContended: a test can mark the host contended, as a slow yield would, and
// free again.
func TestSetContended(t *testing.T) {
	h := &fakeHost{}
	y := h.yielder()
	y.SetContended(true)
	require.True(t, y.Contended())
	h.t += ContendedFor
	require.False(t, y.Contended(), "contended past ContendedFor")
	y.SetContended(true)
	y.SetContended(false)
	require.False(t, y.Contended())
}
