package soft_test

import (
	"context"
	"net"
	"net/netip"
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

// TestConformanceAgent runs the suite in two-host mode: each pair's side b lives behind the
// verbstest agent protocol, over a loopback TCP connection to an agent in this process. Both
// sides use one fabric (the wire between the hosts): side a its device soft0 (127.0.0.1),
// the agent soft1 (127.0.0.2), each chosen by address as hosts of the CI VM choose theirs.
func TestConformanceAgent(t *testing.T) {
	verbstest.Suite{Providers: func(t *testing.T) (a, b verbs.Provider) {
		f := newFabric(t, soft.Options{Devices: 2})
		local, err := verbstest.OnAddr(f, netip.MustParseAddr("127.0.0.1"))
		require.NoError(t, err)
		return local, startAgent(t, f, netip.MustParseAddr("127.0.0.2"))
	}}.Run(t)
}

// startAgent serves f's device holding ip through an agent on a loopback port and returns
// the client's provider. The session ends, and the agent must return nil, when the test
// ends.
func startAgent(t *testing.T, f *soft.Fabric, ip netip.Addr) *verbstest.RemoteProvider {
	t.Helper()
	peer, err := verbstest.OnAddr(f, ip)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- verbstest.ServeAgent(ln, peer) }()
	r, err := verbstest.DialAgent(context.Background(), ln.Addr().String())
	if err != nil {
		ln.Close()
		<-done
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		require.NoError(t, r.Close(), "end the agent session")
		require.NoError(t, <-done, "agent")
	})
	return r
}
