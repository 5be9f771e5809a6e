package fallback

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/testaddr"
)

// offLoopbackIP is an IPv4 address of this host off loopback.
var offLoopbackIP = testaddr.OffLoopbackIPv4

func TestConcreteLocal(t *testing.T) {
	host := offLoopbackIP(t)
	udp := func(s string) net.Addr { return net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	hostPort := func(port int) string { return net.JoinHostPort(host.String(), strconv.Itoa(port)) }
	// The source address of the route to host: host itself, unless policy routing says
	// otherwise (as in the VM harness). Asked of the kernel the usual way, a connected
	// UDP socket, independently of routeSource.
	probe, err := net.Dial("udp4", hostPort(9))
	require.NoError(t, err)
	src := probe.LocalAddr().(*net.UDPAddr).IP.String()
	probe.Close()
	srcPort := func(port int) string { return net.JoinHostPort(src, strconv.Itoa(port)) }
	tests := []struct {
		name          string
		local, remote net.Addr
		want          string
	}{
		{"bound address kept", udp("127.0.0.1:5000"), udp("127.0.0.1:6000"), "127.0.0.1:5000"},
		{"wildcard, peer on loopback", udp("[::]:5000"), udp("127.0.0.1:6000"), "127.0.0.1:5000"},
		{"wildcard, mapped peer on loopback", udp("[::]:5000"), udp("[::ffff:127.0.0.1]:6000"), "127.0.0.1:5000"},
		{"wildcard, peer off loopback", udp("0.0.0.0:5000"), udp(hostPort(6000)), srcPort(5000)},
		{"wildcard, mapped peer off loopback", udp("[::]:5000"), udp("[::ffff:" + host.String() + "]:6000"), srcPort(5000)},
		{"not a UDP address", &net.TCPAddr{IP: net.IPv6zero, Port: 5000}, udp("127.0.0.1:6000"), "[::]:5000"},
		{"no route", udp("0.0.0.0:5000"), udp("[ff02::1]:6000"), "0.0.0.0:5000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, concreteLocal(tc.local, tc.remote).String())
		})
	}
}

// TestQUICOffLoopback dials a listener bound to the wildcard address at this host's
// non-loopback address: both ends report that address as their local one, not the
// wildcard, so that a device can be picked by it.
func TestQUICOffLoopback(t *testing.T) {
	host := offLoopbackIP(t)
	sopts, copts := quicOptions(t)
	copts.TLSConfig.ServerName = "localhost" // the test certificate's name
	ln, err := ListenQUIC("udp", ":0", sopts)
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.UDPAddr).Port
	c, err := DialQUIC(context.Background(), "udp", net.JoinHostPort(host.String(), strconv.Itoa(port)), copts)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte{'!'})
	require.NoError(t, err)
	s, err := ln.AcceptQUIC()
	require.NoError(t, err)
	defer s.Close()
	// Each side's local address is the one the other sees: the packets' real source
	// (the dialed address itself on most hosts, not so where policy routing says
	// otherwise, as in the VM harness).
	ip := func(a net.Addr) netip.Addr { return a.(*net.UDPAddr).AddrPort().Addr().Unmap() }
	require.Equal(t, host, ip(s.LocalAddr()))
	require.Equal(t, ip(s.RemoteAddr()), ip(c.LocalAddr()))
	require.False(t, ip(c.LocalAddr()).IsUnspecified() || ip(c.LocalAddr()).IsLoopback(), "%v", c.LocalAddr())
	require.Equal(t, port, s.LocalAddr().(*net.UDPAddr).Port)
	require.Equal(t, c.LocalAddr().(*net.UDPAddr).Port, s.RemoteAddr().(*net.UDPAddr).Port)
}
