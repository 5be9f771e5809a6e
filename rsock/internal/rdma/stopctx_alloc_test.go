//go:build !race

package rdma

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestStopCtxAllocs: a stopCtx costs its channel, and nothing more as a context.Context.
func TestStopCtxAllocs(t *testing.T) {
	var sink context.Context
	allocs := testing.AllocsPerRun(100, func() {
		s := newStopCtx()
		sink = s
		close(s)
		_ = sink.Err()
	})
	require.Equal(t, 1.0, allocs, "allocations to make, hand over and end a stopCtx")
}
