package verbs

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func gidOf(s string) GID { return GIDFromAddr(netip.MustParseAddr(s)) }

func v1(i int, ip, netdev string) GIDEntry {
	return GIDEntry{Index: i, GID: gidOf(ip), Type: GIDTypeRoCEv1, Netdev: netdev}
}

func v2(i int, ip, netdev string) GIDEntry {
	return GIDEntry{Index: i, GID: gidOf(ip), Type: GIDTypeRoCEv2, Netdev: netdev}
}

func roceDev(name string, state PortState, netdev string, gids ...GIDEntry) DeviceAttr {
	return DeviceAttr{Name: name, Transport: TransportIB, Ports: []PortAttr{{
		Num: 1, State: state, LinkLayer: LinkLayerEthernet, GIDs: gids, Netdevs: []string{netdev},
	}}}
}

func ibDev(name string, ports ...PortAttr) DeviceAttr {
	return DeviceAttr{Name: name, Transport: TransportIB, Ports: ports}
}

func ibPort(num uint8, state PortState, netdev string, gids ...GIDEntry) PortAttr {
	return PortAttr{Num: num, State: state, LinkLayer: LinkLayerInfiniBand, GIDs: gids, Netdevs: []string{netdev}}
}

func ibGID(i int, s string) GIDEntry { return GIDEntry{Index: i, GID: gidOf(s), Type: GIDTypeIB} }

// netdevs maps the test's IPoIB addresses to their interfaces.
func netdevs(ip netip.Addr) (string, error) {
	return map[string]string{"192.168.0.5": "ib0", "192.168.1.5": "ib1", "192.168.2.5": "ib2", "192.168.9.5": "eth9"}[ip.String()], nil
}

func TestSelect(t *testing.T) {
	ll := "fe80::a00:27ff:fe00:5"
	roce := roceDev("mlx5_0", PortActive, "eth0",
		v1(0, ll, "eth0"), v2(1, ll, "eth0"), v1(2, "::ffff:10.0.0.5", "eth0"), v2(3, "::ffff:10.0.0.5", "eth0"),
		v1(4, "fd00::5", "eth0"), v2(5, "fd00::5", "eth0"))
	// The same link-local address on a second device's eth1 (cloned MACs, VMs).
	twin := roceDev("mlx5_1", PortActive, "eth1", v1(0, ll, "eth1"), v2(1, ll, "eth1"))
	// The table of issue 19: 10.77.0.3-5 deleted, 10.77.0.9 at hardware indices 10 and
	// 11, positions 4 and 5 among the populated entries.
	holes := roceDev("rxe0", PortActive, "lo", v1(0, ll, "lo"), v2(1, ll, "lo"),
		v1(2, "::ffff:10.77.0.2", "lo"), v2(3, "::ffff:10.77.0.2", "lo"),
		v1(10, "::ffff:10.77.0.9", "lo"), v2(11, "::ffff:10.77.0.9", "lo"))
	down := roceDev("mlx5_9", PortDown, "eth9", v2(0, "::ffff:10.9.0.5", "eth9"))
	up := roceDev("mlx5_8", PortActive, "eth8", v2(4, "::ffff:10.9.0.5", "eth8"))
	hca0 := ibDev("mlx5_0", ibPort(1, PortActive, "ib0", ibGID(0, "fe80::2:c903:1:1")),
		ibPort(2, PortActive, "ib1", ibGID(3, "fe80::2:c903:1:9"), ibGID(2, "fe80::2:c903:1:2")))
	hca1 := ibDev("mlx5_1", ibPort(1, PortActive, "ib2", ibGID(0, "fe80::2:c903:2:1")))
	big := roceDev("big", PortActive, "eth0", v2(300, "::ffff:10.0.0.1", "eth0"), v1(7, "::ffff:10.0.0.1", "eth0"))

	tests := []struct {
		name    string
		sel     Selector
		devs    []DeviceAttr
		ip      string
		wantDev string
		port    uint8
		index   int
		netdev  string
	}{
		{"RoCE v2 over v1, IPv4", Selector{}, []DeviceAttr{roce}, "10.0.0.5", "mlx5_0", 1, 3, "eth0"},
		{"IPv4-mapped", Selector{}, []DeviceAttr{roce}, "::ffff:10.0.0.5", "mlx5_0", 1, 3, "eth0"},
		{"RoCE v1 preferred", Selector{RoCEVersion: GIDTypeRoCEv1}, []DeviceAttr{roce}, "10.0.0.5", "mlx5_0", 1, 2, "eth0"},
		{"RoCE v2 explicitly", Selector{RoCEVersion: GIDTypeRoCEv2}, []DeviceAttr{roce}, "fd00::5", "mlx5_0", 1, 5, "eth0"},
		{"v1 only: taken", Selector{}, []DeviceAttr{roceDev("r", PortActive, "eth0", v1(9, "::ffff:10.0.0.1", "eth0"))}, "10.0.0.1", "r", 1, 9, "eth0"},
		{"IPv6", Selector{}, []DeviceAttr{roce}, "fd00::5", "mlx5_0", 1, 5, "eth0"},
		{"link-local, zone eth0", Selector{}, []DeviceAttr{roce, twin}, ll + "%eth0", "mlx5_0", 1, 1, "eth0"},
		{"link-local, zone eth1", Selector{}, []DeviceAttr{roce, twin}, ll + "%eth1", "mlx5_1", 1, 1, "eth1"},
		{"holes: hardware index", Selector{}, []DeviceAttr{holes}, "10.77.0.9", "rxe0", 1, 11, "lo"},
		{"down port skipped", Selector{}, []DeviceAttr{down, up}, "10.9.0.5", "mlx5_8", 1, 4, "eth8"},
		{"index an address vector cannot name", Selector{}, []DeviceAttr{big}, "10.0.0.1", "big", 1, 7, "eth0"},
		{"RoCE beats IB", Selector{NetdevOf: netdevs}, []DeviceAttr{hca0, holes}, "10.77.0.9", "rxe0", 1, 11, "lo"},
		{"IB: first HCA port 1", Selector{NetdevOf: netdevs}, []DeviceAttr{hca0, hca1}, "192.168.0.5", "mlx5_0", 1, 0, "ib0"},
		{"IB: port 2, lowest GID", Selector{NetdevOf: netdevs}, []DeviceAttr{hca0, hca1}, "192.168.1.5", "mlx5_0", 2, 2, "ib1"},
		{"IB: second HCA", Selector{NetdevOf: netdevs}, []DeviceAttr{hca0, hca1}, "192.168.2.5", "mlx5_1", 1, 0, "ib2"},
		{"IB: zone names the interface", Selector{NetdevOf: netdevs}, []DeviceAttr{hca0, hca1}, "fe80::1%ib2", "mlx5_1", 1, 0, "ib2"},
		{"unspecified transport", Selector{}, []DeviceAttr{{Name: "old", Ports: roce.Ports}}, "10.0.0.5", "old", 1, 3, "eth0"},
	}
	for _, tt := range tests {
		got, err := tt.sel.Select(tt.devs, netip.MustParseAddr(tt.ip))
		require.NoError(t, err, "%s: Select(%s)", tt.name, tt.ip)
		if got.Device.Name != tt.wantDev || got.Port.Num != tt.port || got.GID.Index != tt.index || got.Netdev != tt.netdev {
			t.Errorf("%s: Select(%s) = %v via %q, want %s port %d GID[%d] via %q", tt.name, tt.ip, got, got.Netdev,
				tt.wantDev, tt.port, tt.index, tt.netdev)
		}
	}
}

func TestSelectFails(t *testing.T) {
	iwarp := roceDev("iw0", PortActive, "eth4", v2(0, "::ffff:10.4.0.5", "eth4"))
	iwarp.Transport = TransportIWARP
	usnic := roceDev("usnic0", PortActive, "eth5", v2(0, "::ffff:10.5.0.5", "eth5"))
	usnic.Transport = TransportOther
	hcaDown := ibDev("mlx5_1", ibPort(1, PortDown, "ib2", ibGID(0, "fe80::2:c903:2:1")))
	hca := ibDev("mlx5_0", ibPort(1, PortActive, "ib0", ibGID(0, "fe80::2:c903:1:1")))
	noGID := ibDev("mlx4_0", ibPort(1, PortActive, "ib1", ibGID(400, "fe80::2:c903:3:1")))

	tests := []struct {
		name string
		devs []DeviceAttr
		ip   string
		want string
	}{
		{"nothing holds it", []DeviceAttr{roceDev("mlx5_0", PortActive, "eth0", v2(3, "::ffff:10.0.0.5", "eth0"))}, "10.0.0.6",
			"verbs: no RDMA port serves 10.0.0.6"},
		{"no devices", nil, "10.0.0.6", "verbs: no RDMA port serves 10.0.0.6"},
		{"down port", []DeviceAttr{roceDev("mlx5_9", PortDown, "eth9", v2(0, "::ffff:10.9.0.5", "eth9"))}, "10.9.0.5",
			"verbs: no RDMA port serves 10.9.0.5: mlx5_9 port 1 holds it but is DOWN"},
		{"iWARP", []DeviceAttr{iwarp}, "10.4.0.5",
			"verbs: no RDMA port serves 10.4.0.5: iw0 holds it but is an iWARP device, which has no RDMA write with immediate"},
		{"other transport", []DeviceAttr{usnic}, "10.5.0.5",
			"verbs: no RDMA port serves 10.5.0.5: usnic0 holds it but its transport (other) has no RC queue pairs"},
		{"index beyond 255", []DeviceAttr{roceDev("big", PortActive, "eth0", v2(256, "::ffff:10.0.0.1", "eth0"))}, "10.0.0.1",
			"verbs: no RDMA port serves 10.0.0.1: big port 1 holds it at GID index 256, beyond the 255 an address vector can name"},
		{"link-local on another interface", []DeviceAttr{roceDev("mlx5_0", PortActive, "eth0", v2(1, "fe80::5", "eth0"))}, "fe80::5%eth1",
			"verbs: no RDMA port serves fe80::5%eth1: mlx5_0 port 1 holds it on eth0, not on eth1"},
		{"IB port down", []DeviceAttr{hca, hcaDown}, "192.168.2.5",
			"verbs: no RDMA port serves 192.168.2.5: mlx5_1 port 1 holds it but is DOWN"},
		{"IB: an interface no port owns", []DeviceAttr{hca}, "192.168.9.5",
			"verbs: no RDMA port serves 192.168.9.5: eth9 holds it, and InfiniBand ports serve the addresses of their IPoIB interfaces: mlx5_0 port 1 (ib0)"},
		{"IB: no interface holds it", []DeviceAttr{hca}, "10.0.0.1",
			"verbs: no RDMA port serves 10.0.0.1: no interface holds it, and InfiniBand ports serve the addresses of their IPoIB interfaces: mlx5_0 port 1 (ib0)"},
		{"IB: no nameable GID", []DeviceAttr{noGID}, "192.168.1.5",
			"verbs: no RDMA port serves 192.168.1.5: mlx4_0 port 1 (ib1) has no GID at an index up to 255"},
	}
	for _, tt := range tests {
		got, err := Selector{NetdevOf: netdevs}.Select(tt.devs, netip.MustParseAddr(tt.ip))
		if err == nil {
			t.Errorf("%s: Select(%s) = %v, want an error", tt.name, tt.ip, got)
			continue
		}
		if !errors.Is(err, ErrNoDevice) {
			t.Errorf("%s: Select(%s) error %q is not ErrNoDevice", tt.name, tt.ip, err)
		}
		if err.Error() != tt.want {
			t.Errorf("%s: Select(%s) error\n%q, want\n%q", tt.name, tt.ip, err, tt.want)
		}
	}
}

func TestSelectInvalidIP(t *testing.T) {
	_, err := SelectPort(nil, netip.Addr{})
	require.ErrorIs(t, err, ErrInvalidArgument)
}

func TestSelectNetdevLookupFails(t *testing.T) {
	boom := errors.New("netlink unavailable")
	sel := Selector{NetdevOf: func(netip.Addr) (string, error) { return "", boom }}
	_, err := sel.Select([]DeviceAttr{ibDev("mlx5_0", ibPort(1, PortActive, "ib0", ibGID(0, "fe80::1")))}, netip.MustParseAddr("192.168.0.5"))
	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorIs(t, err, boom)
}

// TestSelectRoCEAsksNoInterface checks that a RoCE match needs no interface lookup, and
// that the host lookup runs when NetdevOf is nil.
func TestSelectRoCEAsksNoInterface(t *testing.T) {
	sel := Selector{NetdevOf: func(netip.Addr) (string, error) {
		t.Error("NetdevOf called for a RoCE address")
		return "", nil
	}}
	_, err := sel.Select([]DeviceAttr{roceDev("r", PortActive, "eth0", v2(0, "::ffff:10.0.0.1", "eth0"))}, netip.MustParseAddr("10.0.0.1"))
	require.NoError(t, err)

	// 127.0.0.1 is on this host's loopback interface, whatever its name.
	lo, err := hostNetdevOf(netip.MustParseAddr("127.0.0.1"))
	require.NoError(t, err)
	require.NotEmpty(t, lo)
	got, err := SelectPort([]DeviceAttr{ibDev("h", ibPort(1, PortActive, lo, ibGID(0, "fe80::1")))}, netip.MustParseAddr("127.0.0.1"))
	require.NoError(t, err)
	require.Equal(t, lo, got.Netdev)
}

func TestTransportString(t *testing.T) {
	for tr, want := range map[Transport]string{TransportUnspecified: "unspecified", TransportIB: "InfiniBand/RoCE",
		TransportIWARP: "iWARP", TransportOther: "other", Transport(9): "Transport(9)"} {
		if got := tr.String(); got != want {
			t.Errorf("Transport(%d).String() = %q, want %q", int(tr), got, want)
		}
	}
}
