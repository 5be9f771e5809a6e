package shm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/cpuyield"
)

// TestPollYieldsFollowsHost: a CQ tells spinners it yields unless the process's host
// yielder has seen contention.
func TestPollYieldsFollowsHost(t *testing.T) {
	defer cpuyield.Host.SetContended(false)
	var c CQ
	cpuyield.Host.SetContended(false)
	require.True(t, c.PollYields())
	cpuyield.Host.SetContended(true)
	require.False(t, c.PollYields())
}
