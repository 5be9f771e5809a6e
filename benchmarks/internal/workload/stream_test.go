package workload

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWarmupOps: a megabyte's worth of operations, between 16 and 256.
func TestWarmupOps(t *testing.T) {
	for _, tt := range []struct{ size, want int }{{0, 256}, {64, 256}, {4 << 10, 256}, {16 << 10, 64}, {64 << 10, 16}, {1 << 20, 16}} {
		require.Equal(t, tt.want, warmupOps(tt.size), "warmupOps(%d)", tt.size)
	}
}
