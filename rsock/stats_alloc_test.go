//go:build !race

package rsock

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestConnStatsNoAlloc: Stats is meant to be called on every request, so it allocates
// nothing on any transport.
func TestConnStatsNoAlloc(t *testing.T) {
	for _, tc := range statsCases {
		t.Run(tc.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := tc.configs(t, fab)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			exchangeSizes(t, c, s, 100, 100)
			require.Zero(t, testing.AllocsPerRun(100, func() { _ = c.Stats() }), "allocations per Stats call")
			c.Close()
			s.Close()
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}
