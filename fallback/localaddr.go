package fallback

import (
	"net"
	"net/netip"
)

// A QUIC socket is bound to the wildcard address: a dialer's to "[::]:port", and a
// listener's when it listens on ":port". Its own address then names no interface, so a
// caller that picks a network device by the connection's local address (rsock picks
// its RDMA device that way) would find none, except on loopback. A QUICConn therefore
// reports, in place of the wildcard, the source address the kernel's route to the peer
// uses: the address the peer sees its packets come from, as an accepted TCP
// connection's local address is.

// concreteLocal returns local, or, when local's IP is unspecified, the source address of
// the route to remote with local's port. If the route cannot be found, local is
// returned unchanged.
func concreteLocal(local, remote net.Addr) net.Addr {
	l, ok := local.(*net.UDPAddr)
	if !ok || !l.AddrPort().Addr().IsUnspecified() {
		return local
	}
	r, ok := remote.(*net.UDPAddr)
	if !ok {
		return local
	}
	src, err := routeSource(r.AddrPort())
	if err != nil {
		return local
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, uint16(l.Port)))
}

// routeSource returns the source address the kernel chooses for packets to remote. It
// connects a UDP socket, which sends nothing, and reads the address it was bound to.
func routeSource(remote netip.AddrPort) (netip.Addr, error) {
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(remote))
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}
