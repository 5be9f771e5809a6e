package rsock

import (
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/testaddr"
	"github.com/rsockio/rsock/verbs/soft"
)

// offLoopbackIP is an IPv4 address of this host off loopback.
var offLoopbackIP = testaddr.OffLoopbackIPv4

// TestQUICUpgradeOffLoopback dials a QUIC Listener bound to the wildcard address at the
// host's non-loopback address. Both sides look for their RDMA device by that address,
// not by the wildcard one, which found none ("no local IP address for [::]:port"). The
// soft fabric serves loopback addresses only, so here the search ends with the fabric
// saying it has no port for the host's address; on a host whose RDMA device serves it,
// the same search finds the device (the VM harness's two-host steps).
func TestQUICUpgradeOffLoopback(t *testing.T) {
	host := offLoopbackIP(t)
	fab := soft.New(soft.Options{})
	scfg, ccfg := configs(t, FallbackQUIC)
	scfg.Provider, ccfg.Provider = fab, fab
	ccfg.TLSConfig.ServerName = "localhost" // the test certificate's name
	ln, err := Listen("tcp", ":0", scfg)
	require.NoError(t, err)
	defer ln.Close()
	addr := net.JoinHostPort(host.String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	c, err := Dial("tcp", addr, ccfg)
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.AcceptRsock()
	require.NoError(t, err)
	defer s.Close()

	// Each side's local address is the one the other sees: the packets' real source
	// (the dialed address itself on most hosts; the VM harness routes its two hosts'
	// addresses to each other).
	ip := func(a net.Addr) netip.Addr { return a.(*net.UDPAddr).AddrPort().Addr().Unmap() }
	clientIP, serverIP := ip(c.LocalAddr()), ip(s.LocalAddr())
	require.Equal(t, ip(s.RemoteAddr()), clientIP)
	require.Equal(t, ip(c.RemoteAddr()), serverIP)
	require.Equal(t, host, serverIP)
	for _, a := range []netip.Addr{clientIP, serverIP} {
		require.False(t, a.IsUnspecified() || a.IsLoopback(), "%v", a)
	}

	require.Equal(t, TransportQUIC, c.Transport())
	require.ErrorIs(t, c.FallbackReason(), ErrNoDevice)
	require.Contains(t, c.FallbackReason().Error(), "serves "+clientIP.String(), "the client looked for a device by another address")
	// The server, offered no RDMA, looked for no device.
	require.ErrorIs(t, s.FallbackReason(), ErrPeerOfferedNone)
	exchangeHalfClose(t, c, s, []byte("up"), []byte("down"))
}
