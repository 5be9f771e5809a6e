//go:build !race

package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestProgressUpdateAllocs checks that progress.update allocates nothing, on a
// terminal or off one, quiet or not: workload.Timed calls it inside the measured loop,
// where every allocation of the process counts in allocs/op.
func TestProgressUpdateAllocs(t *testing.T) {
	for _, tt := range []struct {
		name       string
		tty, quiet bool
	}{
		{"terminal", true, false},
		{"not a terminal", false, false},
		{"quiet terminal", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newProgress(io.Discard, tt.quiet)
			p.tty = tt.tty
			p.start(44, time.Second)
			p.begin("stream 1MiB RsockRDMA")
			frac := 0.0
			allocs := testing.AllocsPerRun(100, func() {
				frac += 0.013
				p.update(frac)
			})
			require.Zero(t, allocs, "allocations per progress.update")
		})
	}
}
