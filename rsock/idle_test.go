package rsock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// TestCloseIdleDevices: a device stays open after its last connection closes, and
// CloseIdleDevices closes it; a new connection opens it again.
func TestCloseIdleDevices(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	ln := listen(t, scfg)
	for range 2 {
		c, s := pipe(t, ln, ccfg)
		require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
		exchangeSizes(t, c, s, 1000, 3)
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())
		ln.spare.settle()
		// What is left is the endpoint the Listener prepared for its next client
		// (spare.go): CloseIdleDevices releases it too.
		require.Eventually(t, func() bool { return fab.Stats().QPs == ln.spare.qps() }, 30*time.Second, time.Millisecond, "the connections' QPs are destroyed")
		require.NotZero(t, fab.Stats().CQs, "the device stays open, with its CQ, after its last connection")
		require.NoError(t, CloseIdleDevices())
		require.Zero(t, fab.Stats().CQs, "CloseIdleDevices closed the idle device: %+v", fab.Stats())
	}
}
