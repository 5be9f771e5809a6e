package soft_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
	"github.com/rsockio/rsock/verbs/verbstest"
)

// The optional interfaces of the conformance suite.
var (
	_ verbstest.Faults           = (*soft.Fabric)(nil)
	_ verbstest.CapsReporter     = (*soft.QP)(nil)
	_ verbstest.CapacityReporter = (*soft.CQ)(nil)
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testScale speeds the transport timers up twentyfold.
const testScale = 0.05

// newFabric returns a fabric that, when the test ends, must have no live resource left.
func newFabric(t *testing.T, opts soft.Options) *soft.Fabric {
	t.Helper()
	if opts.TimeScale == 0 {
		opts.TimeScale = testScale
	}
	f := soft.New(opts)
	t.Cleanup(func() {
		s := f.Stats()
		require.Zero(t, s.Contexts+s.PDs+s.MRs+s.CQs+s.QPs+s.CompChannels, "live resources after the test: %+v", s)
	})
	return f
}

// TestConformance runs the conformance suite with QP pairs that span two devices.
func TestConformance(t *testing.T) {
	verbstest.Run(t, func(t *testing.T) verbs.Provider { return newFabric(t, soft.Options{Devices: 2}) })
}

// TestConformanceOneDevice runs it with both QPs of each pair on one device.
func TestConformanceOneDevice(t *testing.T) {
	verbstest.Run(t, func(t *testing.T) verbs.Provider { return newFabric(t, soft.Options{Devices: 1}) })
}
