//go:build rdma && linux && cgo

package ibv_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/ibv"
	"github.com/rsockio/rsock/verbs/verbstest"
)

// TestConformance runs the verbs conformance suite against the rdma-core provider when
// this machine has a device with an active port, and skips saying why otherwise.
// With two or more devices the suite connects QPs across two of them; with one, both
// ends of each pair are on the same device.
func TestConformance(t *testing.T) {
	p, err := ibv.Open()
	if err == nil {
		err = activePort(p)
	}
	if err != nil {
		t.Skipf("ibv: no RDMA device on this machine: %v", err)
	}
	verbstest.Suite{
		Providers: func(t *testing.T) (a, b verbs.Provider) { return p, p },
	}.Run(t)
}

// Environment of the two-host mode, set by the harness (.ci/rxe): host B runs
// TestConformancePeerAgent, host A TestConformanceTwoHosts against it.
const (
	envAgentListen = "VERBSTEST_AGENT_LISTEN" // host B: <ipB>:<port> to serve the agent on
	envAgent       = "VERBSTEST_AGENT"        // host A: <ipB>:<port> of the agent
	envLocalIP     = "VERBSTEST_LOCAL_IP"     // host A: its own address
)

// TestConformancePeerAgent is host B of the two-host conformance run: it serves one
// session of the verbstest agent on $VERBSTEST_AGENT_LISTEN with the device whose RoCE v2
// GID holds that address, then returns. Without the variable it is skipped: it only makes
// sense with a client on another host.
func TestConformancePeerAgent(t *testing.T) {
	addr := os.Getenv(envAgentListen)
	if addr == "" {
		t.Skipf("harness mode only: %s (the <ip>:<port> to serve the conformance agent on) is not set", envAgentListen)
	}
	host, _, err := net.SplitHostPort(addr)
	require.NoError(t, err, "%s=%q", envAgentListen, addr)
	ip, err := netip.ParseAddr(host)
	require.NoError(t, err, "%s=%q", envAgentListen, addr)
	peer := openOn(t, ip)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Logf("conformance agent on %s, device %s", addr, deviceName(t, peer))
	require.NoError(t, verbstest.ServeAgent(ln, peer))
}

// TestConformanceTwoHosts is host A of the two-host conformance run: every rule runs with
// side a on the device of $VERBSTEST_LOCAL_IP and side b on the agent at $VERBSTEST_AGENT,
// another host across a real RoCE v2 path. Without the variables it is skipped.
func TestConformanceTwoHosts(t *testing.T) {
	agent, localIP := os.Getenv(envAgent), os.Getenv(envLocalIP)
	var missing []string
	if agent == "" {
		missing = append(missing, envAgent+" (the <ip>:<port> of the peer agent)")
	}
	if localIP == "" {
		missing = append(missing, envLocalIP+" (this host's address)")
	}
	if len(missing) > 0 {
		t.Skipf("harness mode only: %s not set", strings.Join(missing, " and "))
	}
	ip, err := netip.ParseAddr(localIP)
	require.NoError(t, err, "%s=%q", envLocalIP, localIP)
	local := openOn(t, ip)
	remote := dialAgent(t, agent)
	t.Logf("side a: %s on %s; side b: %s at %s", deviceName(t, local), ip, remote.Name(), agent)
	verbstest.Suite{
		Providers: func(t *testing.T) (a, b verbs.Provider) { return local, remote },
	}.Run(t)
	require.NoError(t, remote.Close(), "end the agent session")
}

// openOn opens ibv narrowed to the device whose RoCE v2 GID holds ip.
func openOn(t *testing.T, ip netip.Addr) verbs.Provider {
	t.Helper()
	p, err := ibv.Open()
	require.NoError(t, err)
	on, err := verbstest.OnAddr(p, ip)
	require.NoError(t, err)
	return on
}

func deviceName(t *testing.T, p verbs.Provider) string {
	devs, err := p.Devices()
	require.NoError(t, err)
	return devs[0].Name
}

// dialAgent connects to the agent, retrying while it is not listening yet: the harness
// starts both hosts together.
func dialAgent(t *testing.T, addr string) *verbstest.RemoteProvider {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		r, err := verbstest.DialAgent(ctx, addr)
		if err == nil {
			return r
		}
		if ctx.Err() != nil {
			t.Fatalf("agent %s: %v", addr, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func activePort(p verbs.Provider) error {
	devs, err := p.Devices()
	if err != nil {
		return err
	}
	for _, d := range devs {
		for _, port := range d.Ports {
			if port.State == verbs.PortActive {
				return nil
			}
		}
	}
	return fmt.Errorf("%d devices, none with an ACTIVE port: %w", len(devs), verbs.ErrNoDevice)
}
