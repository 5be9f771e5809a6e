package report

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestCrossCoreRoundTrip: with two processors the probe measures a round trip (below a
// second, a sanity bound and not a timing assertion), with one it declines, and either
// way it leaves no goroutine behind.
func TestCrossCoreRoundTrip(t *testing.T) {
	tests := []struct {
		procs    int
		measured bool
	}{
		{procs: 1, measured: false},
		{procs: 2, measured: true},
	}
	for _, tt := range tests {
		prev := runtime.GOMAXPROCS(tt.procs)
		got := CrossCoreRoundTrip()
		runtime.GOMAXPROCS(prev)
		if tt.measured {
			require.Positive(t, got, "CrossCoreRoundTrip() with GOMAXPROCS %d", tt.procs)
			require.Less(t, got, time.Second, "CrossCoreRoundTrip() with GOMAXPROCS %d", tt.procs)
		} else {
			require.Zero(t, got, "CrossCoreRoundTrip() with GOMAXPROCS %d", tt.procs)
		}
	}
	goleak.VerifyNone(t)
}

// TestProbeCrossCore: a probe is recorded with two processors and not with one.
func TestProbeCrossCore(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var m Machine
	m.ProbeCrossCore()
	require.Empty(t, m.CrossCoreRTTNs, "probes with GOMAXPROCS 1")
	runtime.GOMAXPROCS(2)
	m.ProbeCrossCore()
	require.Len(t, m.CrossCoreRTTNs, 1, "probes with GOMAXPROCS 2")
}

// TestCrossCoreReport: the cores line summarizes the probes, and the note appears when
// the largest is more than twice the smallest.
func TestCrossCoreReport(t *testing.T) {
	tests := []struct {
		name   string
		probes []int64
		line   string
		note   bool
	}{
		{"none", nil, "", false},
		{"one", []int64{80}, "cross-core round trip 80ns (one probe)", false},
		{"near throughout", []int64{80, 82, 90}, "cross-core round trip 82ns (80ns–90ns over 3 probes)", false},
		{"exactly twice", []int64{80, 160}, "cross-core round trip 160ns (80ns–160ns over 2 probes)", false},
		{"near, then far", []int64{80, 360}, "cross-core round trip 360ns (80ns–360ns over 2 probes)", true},
		{"far, near, far", []int64{362, 81, 355}, "cross-core round trip 355ns (81ns–362ns over 3 probes)", true},
		{"a busy processor", []int64{560, 43296, 759}, "cross-core round trip 759ns (560ns–43.3µs over 3 probes)", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Machine{CrossCoreRTTNs: tt.probes}
			require.Equal(t, tt.line, m.crossCoreLine(), "crossCoreLine of %v", tt.probes)
			note := m.CrossCoreNote()
			if !tt.note {
				require.Empty(t, note, "CrossCoreNote of %v", tt.probes)
				return
			}
			require.Contains(t, note, "changed during the run")
			require.Contains(t, note, "not comparable")
		})
	}
	note := Machine{CrossCoreRTTNs: []int64{80, 360}}.CrossCoreNote()
	require.Contains(t, note, "(80ns–360ns)", "the note gives the range")
}
