package verbs

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Transport is what kind of RDMA device a [DeviceAttr] describes: the kernel's node
// type (sysfs node_type), which libibverbs reports as ibv_transport_type.
type Transport int

const (
	// TransportUnspecified: the provider does not say. The selector treats it as
	// [TransportIB], as providers that predate the field are.
	TransportUnspecified Transport = iota
	// TransportIB is a channel adapter (node type CA) whose ports run InfiniBand or
	// RoCE: RC queue pairs with RDMA write with immediate.
	TransportIB
	// TransportIWARP is an iWARP RNIC. iWARP has no immediate data: RDMA write with
	// immediate, which every rsock message is, does not exist on its RC queue pairs.
	TransportIWARP
	// TransportOther is any other node type (switch, router, usNIC): no RC queue pairs.
	TransportOther
)

func (t Transport) String() string {
	switch t {
	case TransportUnspecified:
		return "unspecified"
	case TransportIB:
		return "InfiniBand/RoCE"
	case TransportIWARP:
		return "iWARP"
	case TransportOther:
		return "other"
	}
	return fmt.Sprintf("Transport(%d)", int(t))
}

// MaxGIDIndex is the largest GID index an address vector can name (sgid_index is 8 bits).
const MaxGIDIndex = math.MaxUint8

// Selection is the device, port and source GID that serve one local IP address.
type Selection struct {
	Device DeviceAttr
	Port   PortAttr
	// GID is the source GID entry. GID.Index is its hardware index in the port's table,
	// the address vector's SGIDIndex; tables have holes, so it is not the entry's
	// position in Port.GIDs. It is never above MaxGIDIndex.
	GID GIDEntry
	// Netdev is the network interface the match went through ("" when the provider
	// names none).
	Netdev string
}

func (s Selection) String() string {
	return fmt.Sprintf("%s port %d GID[%d] %v", s.Device.Name, s.Port.Num, s.GID.Index, s.GID.GID)
}

// SelectError reports that no usable port serves a local IP address, and why the ports
// that came close did not: errors.Is(err, ErrNoDevice) holds for it.
type SelectError struct {
	IP netip.Addr
	// Reasons say, one per port or device, why a port that holds the address (or
	// could have) was not chosen, e.g. "mlx5_1 port 1 holds it but is DOWN".
	Reasons []string
	// Err is the failure of the interface lookup (Selector.NetdevOf), or nil.
	Err error
}

func (e *SelectError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "verbs: no RDMA port serves %v", e.IP)
	if len(e.Reasons) > 0 {
		fmt.Fprintf(&b, ": %s", strings.Join(e.Reasons, "; "))
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " (interface lookup: %v)", e.Err)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrNoDevice) true.
func (e *SelectError) Is(target error) bool { return target == ErrNoDevice }

// Unwrap returns the interface lookup's failure, if any.
func (e *SelectError) Unwrap() error { return e.Err }

// Selector chooses the device, port and source GID for connections from one local IP
// address, from a provider's device list ([Provider.Devices]). It reads nothing else:
// every provider, soft included, feeds it the same way. The zero value prefers RoCE v2
// and looks interfaces up on this host.
type Selector struct {
	// RoCEVersion is the preferred RoCE GID type, [GIDTypeRoCEv2] or [GIDTypeRoCEv1].
	// Zero (GIDTypeIB) means RoCE v2. An entry of the other version is taken when the
	// port has none of the preferred one for the address.
	RoCEVersion GIDType
	// NetdevOf names the network interface that holds ip, to find the InfiniBand port
	// whose IPoIB interface it is. It is called only when no RoCE GID matches and ip
	// has no zone (a zone names the interface). nil looks at this host's interfaces.
	NetdevOf func(ip netip.Addr) (string, error)
}

// SelectPort is Selector{}.Select: RoCE v2 preferred, this host's interfaces.
func SelectPort(devs []DeviceAttr, ip netip.Addr) (Selection, error) {
	return Selector{}.Select(devs, ip)
}

// Select returns the device, port and GID that serve local address ip. The rules:
//
//  1. RoCE: a GID of an ACTIVE Ethernet port equal to ip (an IPv4 address as its
//     IPv4-mapped GID). An entry of the preferred version (RoCEVersion) wins over one
//     of the other. With a zone (an IPv6 link-local address, fe80::1%eth0), only an
//     entry whose netdev is the zone's interface matches: the same link-local address
//     can sit on several interfaces.
//  2. InfiniBand: the ACTIVE port whose IPoIB interface (PortAttr.Netdevs) holds ip,
//     the zone's interface or the one NetdevOf names; its lowest populated GID. Each
//     HCA may be its own fabric, so the first active InfiniBand port is no answer.
//     An iWARP device whose interface holds ip is named in the error.
//
// Among equal candidates the first device and port in devs order, then the lowest GID
// index, wins. Entries above [MaxGIDIndex], ports that are not ACTIVE, and devices
// whose transport is iWARP or other are never chosen; when nothing is, the
// [*SelectError] lists the ones that held ip and why each was passed over.
func (s Selector) Select(devs []DeviceAttr, ip netip.Addr) (Selection, error) {
	if !ip.IsValid() {
		return Selection{}, fmt.Errorf("verbs: select port: invalid IP address: %w", ErrInvalidArgument)
	}
	zone := ip.Zone()
	addr := ip.WithZone("").Unmap()
	want := s.RoCEVersion
	if want != GIDTypeRoCEv1 {
		want = GIDTypeRoCEv2
	}
	fail := SelectError{IP: ip} // on the stack: a selection that succeeds allocates nothing for it
	note := func(format string, args ...any) {
		if r := fmt.Sprintf(format, args...); !slices.Contains(fail.Reasons, r) {
			fail.Reasons = append(fail.Reasons, r)
		}
	}

	// Rule 1: RoCE.
	var best Selection
	bestScore := 0
	for _, d := range devs {
		for _, p := range d.Ports {
			if p.LinkLayer != LinkLayerEthernet {
				continue
			}
			for _, g := range p.GIDs {
				if g.GID.IsZero() || g.GID.Addr() != addr {
					continue
				}
				if zone != "" && !zoneMatches(g, p, zone) {
					note("%s port %d holds it on %s, not on %s", d.Name, p.Num, g.Netdev, zone)
					continue
				}
				if !usable(d, p, note) {
					continue
				}
				if g.Index < 0 || g.Index > MaxGIDIndex {
					note("%s port %d holds it at GID index %d, beyond the %d an address vector can name", d.Name, p.Num, g.Index, MaxGIDIndex)
					continue
				}
				score := 1
				if g.Type == want {
					score = 2
				}
				if score > bestScore || (score == bestScore && best.Device.Name == d.Name && best.Port.Num == p.Num && g.Index < best.GID.Index) {
					best, bestScore = Selection{Device: d, Port: p, GID: g, Netdev: g.Netdev}, score
				}
			}
		}
	}
	if bestScore > 0 {
		return best, nil
	}

	// Rule 2: InfiniBand, by IPoIB interface. The ports of devices that cannot serve
	// (iWARP, whose GIDs are no addresses) are looked at too, to say why.
	var ib []string // "mlx5_0 port 1 (ib0)", for the error
	netdev, looked := zone, zone != ""
	for _, d := range devs {
		capable := d.Transport == TransportUnspecified || d.Transport == TransportIB
		for _, p := range d.Ports {
			if capable && p.LinkLayer == LinkLayerEthernet {
				continue
			}
			if capable {
				ib = append(ib, fmt.Sprintf("%s port %d (%s)", d.Name, p.Num, strings.Join(p.Netdevs, ", ")))
			}
			if !looked {
				looked = true
				netdev, fail.Err = s.netdevOf(addr)
				if fail.Err != nil {
					return Selection{}, fail.escape()
				}
			}
			if netdev == "" || !slices.Contains(p.Netdevs, netdev) || !usable(d, p, note) {
				continue
			}
			g, ok := lowestGID(p)
			if !ok {
				note("%s port %d (%s) has no GID at an index up to %d", d.Name, p.Num, netdev, MaxGIDIndex)
				continue
			}
			return Selection{Device: d, Port: p, GID: g, Netdev: netdev}, nil
		}
	}
	if len(ib) > 0 && len(fail.Reasons) == 0 {
		held := "no interface holds it"
		if netdev != "" {
			held = netdev + " holds it"
		}
		note("%s, and InfiniBand ports serve the addresses of their IPoIB interfaces: %s", held, strings.Join(ib, ", "))
	}
	return Selection{}, fail.escape()
}

// escape returns a copy of e on the heap, so that e itself can stay on the stack.
func (e SelectError) escape() *SelectError { return &e }

// usable reports whether port p of d can carry rsock, noting why not.
func usable(d DeviceAttr, p PortAttr, note func(string, ...any)) bool {
	switch d.Transport {
	case TransportIWARP:
		note("%s holds it but is an iWARP device, which has no RDMA write with immediate", d.Name)
		return false
	case TransportUnspecified, TransportIB:
	default:
		note("%s holds it but its transport (%v) has no RC queue pairs", d.Name, d.Transport)
		return false
	}
	if p.State != PortActive {
		note("%s port %d holds it but is %v", d.Name, p.Num, p.State)
		return false
	}
	return true
}

// zoneMatches reports whether GID entry g of port p belongs to interface zone. An entry
// without a netdev (old kernels) matches when the port names zone, or names nothing.
func zoneMatches(g GIDEntry, p PortAttr, zone string) bool {
	if g.Netdev != "" {
		return g.Netdev == zone
	}
	return len(p.Netdevs) == 0 || slices.Contains(p.Netdevs, zone)
}

// lowestGID returns the populated entry of p with the lowest index an address vector can
// name: on InfiniBand, index 0 holds the port GID on a configured port.
func lowestGID(p PortAttr) (GIDEntry, bool) {
	var g GIDEntry
	found := false
	for _, e := range p.GIDs {
		if e.GID.IsZero() || e.Index < 0 || e.Index > MaxGIDIndex {
			continue
		}
		if !found || e.Index < g.Index {
			g, found = e, true
		}
	}
	return g, found
}

func (s Selector) netdevOf(ip netip.Addr) (string, error) {
	if s.NetdevOf != nil {
		return s.NetdevOf(ip)
	}
	return hostNetdevOf(ip)
}

// hostNetdevOf names the interface of this host that holds ip, or "".
func hostNetdevOf(ip netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list interfaces: %w", err)
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if pfx, ok := a.(*net.IPNet); ok {
				if got, ok := netip.AddrFromSlice(pfx.IP); ok && got.Unmap() == ip {
					return ifc.Name, nil
				}
			}
		}
	}
	return "", nil
}
