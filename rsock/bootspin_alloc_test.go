//go:build !race

package rsock

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestBootSpinAllocs bounds what polling costs a handshake: one allocation when it
// starts (the socket's handle; the try's callback is pooled), none per Read that the polling serves.
// testing.AllocsPerRun counts every goroutine's allocations, and an earlier test's
// teardown may still be running: the fewest of three measurements is the one kept,
// since background work can only add.
func TestBootSpinAllocs(t *testing.T) {
	c, s := spinPair(t)
	var r bootSpin
	buf := make([]byte, 1)
	read := func() {
		if _, err := s.Write(buf); err != nil {
			panic(err)
		}
		if _, err := r.Read(buf); err != nil {
			panic(err)
		}
	}
	fewest := func(f func()) float64 {
		least := testing.AllocsPerRun(20, f)
		for range 2 {
			least = min(least, testing.AllocsPerRun(20, f))
		}
		return least
	}
	allocs := fewest(func() {
		r.init(c, 1<<20) // the spins end with the byte; many, in case loopback delivers late
		read()
	})
	require.LessOrEqual(t, allocs, 1.0, "allocations per init and Read")
	require.Zero(t, fewest(read), "allocations per Read")
	// Every Read since the last init: its own, and three times AllocsPerRun's 1+20.
	require.Equal(t, 1+3*21, r.hits, "Reads the polling served")
}
