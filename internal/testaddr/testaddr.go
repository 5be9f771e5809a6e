// Package testaddr finds addresses of this host for tests that must leave loopback.
package testaddr

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// OffLoopbackIPv4 returns an IPv4 address of this host that is not a loopback address,
// on an interface that is up. Tests off loopback need one; every CI host and the VM
// harness have one, so its absence fails the test rather than skipping it.
func OffLoopbackIPv4(t testing.TB) netip.Addr {
	t.Helper()
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		require.NoError(t, err)
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && p.Addr().IsGlobalUnicast() {
				return p.Addr()
			}
		}
	}
	require.FailNow(t, "this test needs an IPv4 address on an interface that is up and not loopback")
	return netip.Addr{}
}
