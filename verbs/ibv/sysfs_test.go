package ibv

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// fakeNetdevs maps the addresses of the IPoIB interfaces in testdata/sysfs-ib.
func fakeNetdevs(ip netip.Addr) (string, error) {
	m := map[string]string{
		"192.168.0.5":  "ib0",
		"192.168.1.5":  "ib1",
		"192.168.2.5":  "ib2",
		"192.168.3.5":  "ib3",
		"fd01::5":      "ib0",
		"192.168.99.5": "eth9", // an interface no RDMA port owns
	}
	return m[ip.String()], nil
}

func gid(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }

func TestSelect(t *testing.T) {
	tests := []struct {
		tree string
		ip   string
		want Selection
	}{
		// RoCE v2 over IPv4: the v2 entry wins over the v1 entry for the same address.
		{"sysfs-roce", "10.0.0.5", Selection{Device: "mlx5_0", Port: 1, GIDIndex: 3, GID: gid("::ffff:10.0.0.5"),
			Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth0"}},
		// An IPv4-mapped address means the same port.
		{"sysfs-roce", "::ffff:10.0.0.5", Selection{Device: "mlx5_0", Port: 1, GIDIndex: 3, GID: gid("::ffff:10.0.0.5"),
			Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth0"}},
		// RoCE v2 over IPv6.
		{"sysfs-roce", "fd00::5", Selection{Device: "mlx5_0", Port: 1, GIDIndex: 5, GID: gid("fd00::5"),
			Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth0"}},
		// A link-local address with a zone.
		{"sysfs-roce", "fe80::a00:27ff:fe00:5%eth0", Selection{Device: "mlx5_0", Port: 1, GIDIndex: 1,
			GID: gid("fe80::a00:27ff:fe00:5"), Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth0"}},
		// Several devices: the first device holding the address.
		{"sysfs-multi", "10.0.0.5", Selection{Device: "mlx5_0", Port: 1, GIDIndex: 3, GID: gid("::ffff:10.0.0.5"),
			Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth0"}},
		// Only a RoCE v1 entry: v1 is taken.
		{"sysfs-multi", "10.2.0.5", Selection{Device: "mlx5_2", Port: 1, GIDIndex: 0, GID: gid("::ffff:10.2.0.5"),
			Type: verbs.GIDTypeRoCEv1, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth2"}},
		// The second port of a device.
		{"sysfs-multi", "10.3.0.5", Selection{Device: "mlx5_2", Port: 2, GIDIndex: 1, GID: gid("::ffff:10.3.0.5"),
			Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth3"}},
		// Held by a DOWN port (mlx5_1) and an ACTIVE one: the active one.
		{"sysfs-multi", "10.9.0.5", Selection{Device: "mlx5_2", Port: 2, GIDIndex: 3, GID: gid("::ffff:10.9.0.5"),
			Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth3"}},
		// No gid_attrs (old kernel): RoCE v1, no netdev.
		{"sysfs-multi", "10.4.0.5", Selection{Device: "rxe0", Port: 1, GIDIndex: 0, GID: gid("::ffff:10.4.0.5"),
			Type: verbs.GIDTypeRoCEv1, LinkLayer: verbs.LinkLayerEthernet}},
		// A table with holes: the hardware index (7), not the position among the
		// populated entries (3).
		{"sysfs-holes", "10.77.0.9", Selection{Device: "rxe0", Port: 1, GIDIndex: 7, GID: gid("::ffff:10.77.0.9"),
			Type: verbs.GIDTypeRoCEv2, LinkLayer: verbs.LinkLayerEthernet, Netdev: "eth0"}},
		// InfiniBand: IPoIB interface by dev_port.
		{"sysfs-ib", "192.168.0.5", Selection{Device: "mlx5_0", Port: 1, GIDIndex: 0, GID: gid("fe80::2:c903:1:1"),
			Type: verbs.GIDTypeIB, LinkLayer: verbs.LinkLayerInfiniBand, Netdev: "ib0"}},
		{"sysfs-ib", "fd01::5", Selection{Device: "mlx5_0", Port: 1, GIDIndex: 0, GID: gid("fe80::2:c903:1:1"),
			Type: verbs.GIDTypeIB, LinkLayer: verbs.LinkLayerInfiniBand, Netdev: "ib0"}},
		{"sysfs-ib", "192.168.1.5", Selection{Device: "mlx5_0", Port: 2, GIDIndex: 0, GID: gid("fe80::2:c903:1:2"),
			Type: verbs.GIDTypeIB, LinkLayer: verbs.LinkLayerInfiniBand, Netdev: "ib1"}},
		// InfiniBand: interface named by gid_attrs/ndevs; GID 0 unused, so GID 1.
		{"sysfs-ib", "192.168.3.5", Selection{Device: "mlx4_0", Port: 1, GIDIndex: 1, GID: gid("fe80::2:c903:3:1"),
			Type: verbs.GIDTypeIB, LinkLayer: verbs.LinkLayerInfiniBand, Netdev: "ib3"}},
	}
	for _, tt := range tests {
		s := Selector{SysfsRoot: "testdata/" + tt.tree, NetdevOf: fakeNetdevs}
		got, err := s.Select(netip.MustParseAddr(tt.ip))
		require.NoError(t, err, "Select(%s) in %s", tt.ip, tt.tree)
		if got != tt.want {
			t.Errorf("Select(%s) in %s = %+v, want %+v", tt.ip, tt.tree, got, tt.want)
		}
	}
}

func TestSelectNoDevice(t *testing.T) {
	tests := []struct {
		tree     string
		ip       string
		wantText string
	}{
		{"sysfs-roce", "10.0.0.6", "ibv: no RDMA device holds 10.0.0.6"},
		{"sysfs-multi", "10.1.0.5", "ibv: no RDMA device holds 10.1.0.5 on an active port (mlx5_1 port 1 (DOWN) holds it but is not active)"},
		{"sysfs-ib", "192.168.2.5", "ibv: no RDMA device holds 192.168.2.5 on an active port (mlx5_1 port 1 (DOWN) holds it but is not active)"},
		{"sysfs-ib", "192.168.99.5", "ibv: no RDMA device holds 192.168.99.5"},
		{"sysfs-ib", "10.0.0.5", "ibv: no RDMA device holds 10.0.0.5"},
		{"sysfs-empty", "10.0.0.5", "ibv: no RDMA device holds 10.0.0.5"},
		{"sysfs-missing", "10.0.0.5", "ibv: no RDMA device holds 10.0.0.5: no testdata/sysfs-missing/class/infiniband (no RDMA devices, or no kernel RDMA support)"},
	}
	for _, tt := range tests {
		s := Selector{SysfsRoot: "testdata/" + tt.tree, NetdevOf: fakeNetdevs}
		got, err := s.Select(netip.MustParseAddr(tt.ip))
		if err == nil {
			t.Errorf("Select(%s) in %s = %+v, want an error", tt.ip, tt.tree, got)
			continue
		}
		if !errors.Is(err, verbs.ErrNoDevice) {
			t.Errorf("Select(%s) in %s: error %q is not verbs.ErrNoDevice", tt.ip, tt.tree, err)
		}
		if err.Error() != tt.wantText {
			t.Errorf("Select(%s) in %s: error %q, want %q", tt.ip, tt.tree, err, tt.wantText)
		}
	}
}

func TestSelectInvalidIP(t *testing.T) {
	_, err := SelectGID("testdata/sysfs-roce", netip.Addr{})
	require.ErrorIs(t, err, verbs.ErrInvalidArgument)
}

func TestSelectNetdevLookupFails(t *testing.T) {
	s := Selector{SysfsRoot: "testdata/sysfs-ib", NetdevOf: func(netip.Addr) (string, error) {
		return "", errors.New("netlink unavailable")
	}}
	_, err := s.Select(netip.MustParseAddr("192.168.0.5"))
	require.ErrorIs(t, err, verbs.ErrNoDevice)
}

// TestSelectRoCEDoesNotAskForNetdev checks that a RoCE match needs no interface lookup.
func TestSelectRoCEDoesNotAskForNetdev(t *testing.T) {
	s := Selector{SysfsRoot: "testdata/sysfs-multi", NetdevOf: func(netip.Addr) (string, error) {
		t.Error("NetdevOf called for a RoCE address")
		return "", nil
	}}
	_, err := s.Select(netip.MustParseAddr("10.3.0.5"))
	require.NoError(t, err)
}

func TestReadGIDTable(t *testing.T) {
	tests := []struct {
		tree   string
		device string
		port   uint8
		want   []verbs.GIDEntry
	}{
		{"sysfs-roce", "mlx5_0", 1, []verbs.GIDEntry{
			{Index: 0, GID: gid("fe80::a00:27ff:fe00:5"), Type: verbs.GIDTypeRoCEv1, Netdev: "eth0"},
			{Index: 1, GID: gid("fe80::a00:27ff:fe00:5"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
			{Index: 2, GID: gid("::ffff:10.0.0.5"), Type: verbs.GIDTypeRoCEv1, Netdev: "eth0"},
			{Index: 3, GID: gid("::ffff:10.0.0.5"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
			{Index: 4, GID: gid("fd00::5"), Type: verbs.GIDTypeRoCEv1, Netdev: "eth0"},
			{Index: 5, GID: gid("fd00::5"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
		}},
		// Holes keep their hardware indices.
		{"sysfs-holes", "rxe0", 1, []verbs.GIDEntry{
			{Index: 0, GID: gid("fe80::5054:ff:fe12:3456"), Type: verbs.GIDTypeRoCEv1, Netdev: "eth0"},
			{Index: 1, GID: gid("fe80::5054:ff:fe12:3456"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
			{Index: 6, GID: gid("::ffff:10.77.0.9"), Type: verbs.GIDTypeRoCEv1, Netdev: "eth0"},
			{Index: 7, GID: gid("::ffff:10.77.0.9"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
		}},
		{"sysfs-multi", "rxe0", 1, []verbs.GIDEntry{
			{Index: 0, GID: gid("::ffff:10.4.0.5"), Type: verbs.GIDTypeRoCEv1},
		}},
		{"sysfs-ib", "mlx5_0", 2, []verbs.GIDEntry{
			{Index: 0, GID: gid("fe80::2:c903:1:2"), Type: verbs.GIDTypeIB},
		}},
		{"sysfs-ib", "mlx4_0", 1, []verbs.GIDEntry{
			{Index: 1, GID: gid("fe80::2:c903:3:1"), Type: verbs.GIDTypeIB, Netdev: "ib3"},
		}},
	}
	for _, tt := range tests {
		got, err := ReadGIDTable("testdata/"+tt.tree, tt.device, tt.port)
		require.NoError(t, err, "ReadGIDTable(%s, %s, %d)", tt.tree, tt.device, tt.port)
		require.Equal(t, tt.want, got, "ReadGIDTable(%s, %s, %d)", tt.tree, tt.device, tt.port)
	}
}

func TestReadGIDTableMissingPort(t *testing.T) {
	_, err := ReadGIDTable("testdata/sysfs-roce", "mlx5_0", 2)
	require.Error(t, err)
	if !strings.HasPrefix(err.Error(), "ibv: port 2 of mlx5_0") {
		t.Errorf("ReadGIDTable(sysfs-roce, mlx5_0, 2) error = %q, want it to name the port", err)
	}
}

func TestParsePortState(t *testing.T) {
	tests := []struct {
		in       string
		want     verbs.PortState
		wantText string
	}{
		{"4: ACTIVE", verbs.PortActive, "ACTIVE"},
		{"1: DOWN", verbs.PortDown, "DOWN"},
		{"2: INIT", verbs.PortInit, "INIT"},
		{"garbage", verbs.PortNop, "garbage"},
	}
	for _, tt := range tests {
		got, text := parsePortState(tt.in)
		if got != tt.want || text != tt.wantText {
			t.Errorf("parsePortState(%q) = %v, %q, want %v, %q", tt.in, got, text, tt.want, tt.wantText)
		}
	}
}
