//go:build !race

package rsock

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/allocguard"
	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestConnSteadyStateAllocs checks that a Conn upgraded to RDMA allocates nothing in
// steady-state Write and Read, over a soft fabric, whichever transport bootstrapped it:
// the public layer must add nothing to the engine's zero (guarded by the engine's own
// TestSteadyStateAllocs). testing.AllocsPerRun counts every goroutine's allocations, so
// the pollers, the control channel and the peer's goroutine are included.
func TestConnSteadyStateAllocs(t *testing.T) {
	const size = 64 << 10
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, f, fab)
			ln := listen(t, scfg)
			pair := func(t *testing.T) (net.Conn, net.Conn) {
				c, s := pipe(t, ln, ccfg)
				require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
				require.Equal(t, TransportRDMA, s.Transport(), "server: %v", s.FallbackReason())
				return c, s
			}

			allocguard.SteadyState(t, size, pair)

			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}
