package ibv

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
		"10.5.0.5":     "eth5", // the iWARP device's interface
		"192.168.99.5": "eth9", // an interface no RDMA port owns
	}
	return m[ip.String()], nil
}

func gid(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }

// sel is what the selector chose, in the fields these tests compare.
type sel struct {
	Device    string
	Port      uint8
	GIDIndex  int
	GID       verbs.GID
	Type      verbs.GIDType
	LinkLayer verbs.LinkLayer
	Netdev    string
}

// TestSelect feeds fake sysfs trees through the reader (sysfsDevices, the sysfs half of
// the provider's Devices) to the one selector, verbs.Selector.
func TestSelect(t *testing.T) {
	tests := []struct {
		tree string
		ip   string
		pref verbs.GIDType
		want sel
	}{
		// RoCE v2 over IPv4: the v2 entry wins over the v1 entry for the same address.
		{"sysfs-roce", "10.0.0.5", 0, sel{"mlx5_0", 1, 3, gid("::ffff:10.0.0.5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth0"}},
		// RoCE v1 when preferred.
		{"sysfs-roce", "10.0.0.5", verbs.GIDTypeRoCEv1, sel{"mlx5_0", 1, 2, gid("::ffff:10.0.0.5"), verbs.GIDTypeRoCEv1, verbs.LinkLayerEthernet, "eth0"}},
		// An IPv4-mapped address means the same port.
		{"sysfs-roce", "::ffff:10.0.0.5", 0, sel{"mlx5_0", 1, 3, gid("::ffff:10.0.0.5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth0"}},
		// RoCE v2 over IPv6.
		{"sysfs-roce", "fd00::5", 0, sel{"mlx5_0", 1, 5, gid("fd00::5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth0"}},
		// A link-local address with a zone: the zone's interface picks the device.
		{"sysfs-roce", "fe80::a00:27ff:fe00:5%eth0", 0, sel{"mlx5_0", 1, 1, gid("fe80::a00:27ff:fe00:5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth0"}},
		{"sysfs-roce", "fe80::a00:27ff:fe00:5%eth1", 0, sel{"mlx5_1", 1, 1, gid("fe80::a00:27ff:fe00:5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth1"}},
		// Several devices: the first device holding the address.
		{"sysfs-multi", "10.0.0.5", 0, sel{"mlx5_0", 1, 3, gid("::ffff:10.0.0.5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth0"}},
		// Only a RoCE v1 entry: v1 is taken.
		{"sysfs-multi", "10.2.0.5", 0, sel{"mlx5_2", 1, 0, gid("::ffff:10.2.0.5"), verbs.GIDTypeRoCEv1, verbs.LinkLayerEthernet, "eth2"}},
		// The second port of a device.
		{"sysfs-multi", "10.3.0.5", 0, sel{"mlx5_2", 2, 1, gid("::ffff:10.3.0.5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth3"}},
		// Held by a DOWN port (mlx5_1) and an ACTIVE one: the active one.
		{"sysfs-multi", "10.9.0.5", 0, sel{"mlx5_2", 2, 3, gid("::ffff:10.9.0.5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth3"}},
		// No gid_attrs (old kernel): RoCE v1, no netdev.
		{"sysfs-multi", "10.4.0.5", 0, sel{"rxe0", 1, 0, gid("::ffff:10.4.0.5"), verbs.GIDTypeRoCEv1, verbs.LinkLayerEthernet, ""}},
		// A table with holes: the hardware index (7), not the position among the
		// populated entries (3).
		{"sysfs-holes", "10.77.0.9", 0, sel{"rxe0", 1, 7, gid("::ffff:10.77.0.9"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth0"}},
		// InfiniBand, several HCAs: the port whose IPoIB interface holds the address,
		// found by dev_port.
		{"sysfs-ib", "192.168.0.5", 0, sel{"mlx5_0", 1, 0, gid("fe80::2:c903:1:1"), verbs.GIDTypeIB, verbs.LinkLayerInfiniBand, "ib0"}},
		{"sysfs-ib", "fd01::5", 0, sel{"mlx5_0", 1, 0, gid("fe80::2:c903:1:1"), verbs.GIDTypeIB, verbs.LinkLayerInfiniBand, "ib0"}},
		{"sysfs-ib", "192.168.1.5", 0, sel{"mlx5_0", 2, 0, gid("fe80::2:c903:1:2"), verbs.GIDTypeIB, verbs.LinkLayerInfiniBand, "ib1"}},
		// InfiniBand: a later HCA, its interface named by gid_attrs/ndevs; GID 0
		// unused, so GID 1.
		{"sysfs-ib", "192.168.3.5", 0, sel{"mlx4_0", 1, 1, gid("fe80::2:c903:3:1"), verbs.GIDTypeIB, verbs.LinkLayerInfiniBand, "ib3"}},
		// InfiniBand link-local with a zone: the zone names the interface.
		{"sysfs-ib", "fe80::1%ib1", 0, sel{"mlx5_0", 2, 0, gid("fe80::2:c903:1:2"), verbs.GIDTypeIB, verbs.LinkLayerInfiniBand, "ib1"}},
		// A RoCE device beside an iWARP one.
		{"sysfs-iwarp", "10.6.0.5", 0, sel{"mlx5_0", 1, 1, gid("::ffff:10.6.0.5"), verbs.GIDTypeRoCEv2, verbs.LinkLayerEthernet, "eth6"}},
	}
	for _, tt := range tests {
		devs, err := sysfsDevices("testdata/" + tt.tree)
		require.NoError(t, err, "sysfsDevices(%s)", tt.tree)
		s := verbs.Selector{RoCEVersion: tt.pref, NetdevOf: fakeNetdevs}
		got, err := s.Select(devs, netip.MustParseAddr(tt.ip))
		require.NoError(t, err, "Select(%s) in %s", tt.ip, tt.tree)
		g := sel{got.Device.Name, got.Port.Num, got.GID.Index, got.GID.GID, got.GID.Type, got.Port.LinkLayer, got.Netdev}
		if g != tt.want {
			t.Errorf("Select(%s) in %s = %+v, want %+v", tt.ip, tt.tree, g, tt.want)
		}
	}
}

func TestSelectNoDevice(t *testing.T) {
	tests := []struct {
		tree     string
		ip       string
		wantText string
	}{
		{"sysfs-roce", "10.0.0.6", "verbs: no RDMA port serves 10.0.0.6"},
		{"sysfs-roce", "fe80::a00:27ff:fe00:5%eth7", "verbs: no RDMA port serves fe80::a00:27ff:fe00:5%eth7: " +
			"mlx5_0 port 1 holds it on eth0, not on eth7; mlx5_1 port 1 holds it on eth1, not on eth7"},
		{"sysfs-multi", "10.1.0.5", "verbs: no RDMA port serves 10.1.0.5: mlx5_1 port 1 holds it but is DOWN"},
		{"sysfs-ib", "192.168.2.5", "verbs: no RDMA port serves 192.168.2.5: mlx5_1 port 1 holds it but is DOWN"},
		{"sysfs-ib", "192.168.99.5", "verbs: no RDMA port serves 192.168.99.5: eth9 holds it, and InfiniBand ports serve " +
			"the addresses of their IPoIB interfaces: mlx4_0 port 1 (ib3), mlx5_0 port 1 (ib0), mlx5_0 port 2 (ib1), mlx5_1 port 1 (ib2)"},
		{"sysfs-iwarp", "10.5.0.5", "verbs: no RDMA port serves 10.5.0.5: iwp0 holds it but is an iWARP device, which has no RDMA write with immediate"},
		{"sysfs-empty", "10.0.0.5", "verbs: no RDMA port serves 10.0.0.5"},
	}
	for _, tt := range tests {
		devs, err := sysfsDevices("testdata/" + tt.tree)
		require.NoError(t, err, "sysfsDevices(%s)", tt.tree)
		got, err := verbs.Selector{NetdevOf: fakeNetdevs}.Select(devs, netip.MustParseAddr(tt.ip))
		if err == nil {
			t.Errorf("Select(%s) in %s = %v, want an error", tt.ip, tt.tree, got)
			continue
		}
		if !errors.Is(err, verbs.ErrNoDevice) {
			t.Errorf("Select(%s) in %s: error %q is not verbs.ErrNoDevice", tt.ip, tt.tree, err)
		}
		if err.Error() != tt.wantText {
			t.Errorf("Select(%s) in %s: error\n%q, want\n%q", tt.ip, tt.tree, err, tt.wantText)
		}
	}
}

// TestSysfsDevices checks what the reader makes of a tree besides GID tables: the
// transport from node_type and each port's netdevs.
func TestSysfsDevices(t *testing.T) {
	devs, err := sysfsDevices("testdata/sysfs-ib")
	require.NoError(t, err)
	type port struct {
		dev       string
		transport verbs.Transport
		num       uint8
		state     verbs.PortState
		netdevs   []string
	}
	var got []port
	for _, d := range devs {
		for _, p := range d.Ports {
			got = append(got, port{d.Name, d.Transport, p.Num, p.State, p.Netdevs})
		}
	}
	require.Equal(t, []port{
		{"mlx4_0", verbs.TransportUnspecified, 1, verbs.PortActive, []string{"ib3"}},
		{"mlx5_0", verbs.TransportIB, 1, verbs.PortActive, []string{"ib0"}},
		{"mlx5_0", verbs.TransportIB, 2, verbs.PortActive, []string{"ib1"}},
		{"mlx5_1", verbs.TransportIB, 1, verbs.PortDown, []string{"ib2"}},
	}, got)

	devs, err = sysfsDevices("testdata/sysfs-iwarp")
	require.NoError(t, err)
	require.Equal(t, verbs.TransportIWARP, devs[0].Transport)
	require.Equal(t, []string{"eth5"}, devs[0].Ports[0].Netdevs)

	_, err = sysfsDevices("testdata/sysfs-missing")
	require.ErrorContains(t, err, "no testdata/sysfs-missing/class/infiniband (no RDMA devices, or no kernel RDMA support)")
}

// TestSysfsSoftRoCE: the trees' rxe devices, which carry rxe's parent attribute, are
// Soft-RoCE; the hardware devices beside them are not.
func TestSysfsSoftRoCE(t *testing.T) {
	for _, tree := range []string{"sysfs-multi", "sysfs-holes", "sysfs-roce", "sysfs-ib", "sysfs-iwarp", "sysfs-fake"} {
		devs, err := sysfsDevices(filepath.Join("testdata", tree))
		require.NoError(t, err)
		for _, d := range devs {
			if want := strings.HasPrefix(d.Name, "rxe"); d.SoftRoCE != want {
				t.Errorf("%s: %s.SoftRoCE = %v, want %v", tree, d.Name, d.SoftRoCE, want)
			}
		}
	}
}

func TestReadTransport(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		nodeType string // "" for no file
		want     verbs.Transport
	}{
		{"", verbs.TransportUnspecified},
		{"1: CA", verbs.TransportIB},
		{"4: RNIC", verbs.TransportIWARP},
		{"5: usNIC", verbs.TransportOther},
		{"2: switch", verbs.TransportOther},
	} {
		dev := filepath.Join(dir, "class", "infiniband", "d")
		require.NoError(t, os.MkdirAll(dev, 0o755))
		os.Remove(filepath.Join(dev, "node_type"))
		if tt.nodeType != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dev, "node_type"), []byte(tt.nodeType+"\n"), 0o644))
		}
		got, err := readTransport(dir, "d")
		require.NoError(t, err)
		if got != tt.want {
			t.Errorf("readTransport(node_type %q) = %v, want %v", tt.nodeType, got, tt.want)
		}
	}
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

// TestSysfsOutOfFiles fails each open of a fake tree's read in turn with EMFILE, as a
// process short of descriptors sees it when its other threads hold the rest: every
// such read fails with EMFILE. A file that could not be opened is never taken for an
// attribute the device lacks (an unpopulated GID entry, a port without netdevs, a
// device of unknown transport), which would turn a want of files into a listing that
// says no port serves the address.
func TestSysfsOutOfFiles(t *testing.T) {
	defer func() { openFault = nil }()
	for _, tree := range []string{"sysfs-multi", "sysfs-holes", "sysfs-ib", "sysfs-iwarp", "sysfs-fake"} {
		root := filepath.Join("testdata", tree)
		opens := 0
		openFault = func(string) error { opens++; return nil }
		_, err := sysfsDevices(root)
		require.NoError(t, err, tree)
		require.NotZero(t, opens, tree)
		for fail := range opens {
			n := 0
			openFault = func(path string) error {
				n++
				if n == fail+1 {
					return &fs.PathError{Op: "open", Path: path, Err: syscall.EMFILE}
				}
				return nil
			}
			_, err := sysfsDevices(root)
			require.ErrorIs(t, err, syscall.EMFILE, "%s, open %d of %d failing", tree, fail+1, opens)
		}
	}
}
