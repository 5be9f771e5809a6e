//go:build !race

package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestStatsNoAlloc: Stats is meant to be called on every request, so it allocates
// nothing.
func TestStatsNoAlloc(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, statsOptions)
	allocs := testing.AllocsPerRun(100, func() { _ = a.Stats() })
	require.Zero(t, allocs, "allocations per Stats call")
	a.Close()
	b.Close()
	requireReleased(t, f)
}
