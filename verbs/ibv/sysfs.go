package ibv

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/rsockio/rsock/verbs"
)

// DefaultSysfsRoot is where sysfs is mounted on Linux.
const DefaultSysfsRoot = "/sys"

// Selection is the device, port and GID index that serve one local IP address: the
// values a QP needs for its INIT transition (port) and for the source side of its
// address vector (GID index).
type Selection struct {
	Device    string // kernel device name, e.g. "mlx5_0"
	Port      uint8  // 1-based port number
	GIDIndex  int    // index in the port's GID table (the address vector's SGIDIndex)
	GID       verbs.GID
	Type      verbs.GIDType
	LinkLayer verbs.LinkLayer
	Netdev    string // network interface the match went through, or "" if sysfs names none
}

func (s Selection) String() string {
	return fmt.Sprintf("%s port %d GID[%d] %v", s.Device, s.Port, s.GIDIndex, s.GID)
}

// NoDeviceError reports that no active RDMA port serves a local IP address.
// errors.Is(err, verbs.ErrNoDevice) holds for it.
type NoDeviceError struct {
	IP netip.Addr
	// Inactive lists the ports that hold the address but are not ACTIVE,
	// e.g. "mlx5_1 port 1 (DOWN)".
	Inactive []string
	// Err is what made the search fail early (sysfs unreadable), or nil.
	Err error
}

func (e *NoDeviceError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ibv: no RDMA device holds %v", e.IP)
	if len(e.Inactive) > 0 {
		fmt.Fprintf(&b, " on an active port (%s holds it but is not active)", strings.Join(e.Inactive, ", "))
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Is makes errors.Is(err, verbs.ErrNoDevice) true.
func (e *NoDeviceError) Is(target error) bool { return target == verbs.ErrNoDevice }

// Unwrap returns the underlying cause, if any.
func (e *NoDeviceError) Unwrap() error { return e.Err }

// SelectGID finds the RDMA device, port and GID index that serve the local address ip,
// reading sysfs under sysfsRoot (normally [DefaultSysfsRoot]). For InfiniBand ports
// it looks up which network interface holds ip with the host's interface table.
// See [Selector.Select] for the rules.
func SelectGID(sysfsRoot string, ip netip.Addr) (Selection, error) {
	return Selector{SysfsRoot: sysfsRoot}.Select(ip)
}

// Selector finds the RDMA port that serves a local IP address, from sysfs.
// The zero value reads /sys and the host's interfaces.
type Selector struct {
	// SysfsRoot is where sysfs is mounted; "" means DefaultSysfsRoot.
	SysfsRoot string
	// NetdevOf names the network interface that holds ip. It is consulted only when
	// no RoCE GID matches ip, to find an IPoIB interface. nil uses net.Interfaces.
	NetdevOf func(ip netip.Addr) (string, error)
}

// Select returns the port and GID index that serve the local address ip.
//
// The rules, in order of preference:
//
//  1. RoCE: a GID table entry of an Ethernet port that equals ip (an IPv4 address as
//     the IPv4-mapped GID ::ffff:a.b.c.d) on an ACTIVE port. A RoCE v2 entry wins
//     over a RoCE v1 entry for the same address.
//  2. InfiniBand: ip is held by an IPoIB interface of an ACTIVE InfiniBand port.
//     The interface belongs to port P of device D when gid_attrs/ndevs of P names it,
//     or when it is listed under D's device/net/ directory and its dev_port file
//     (0-based) is P-1; an interface without dev_port belongs to a single-port device's
//     only port. The selected GID is the lowest non-zero entry of the port's table
//     (index 0, the port GID, on a configured port).
//
// Among equal candidates the first device in name order, then the lowest port, then
// the lowest GID index wins. Ports whose state is not ACTIVE are never selected; if
// one holds ip, the returned *NoDeviceError says so.
func (s Selector) Select(ip netip.Addr) (Selection, error) {
	ip = ip.WithZone("").Unmap()
	if !ip.IsValid() {
		return Selection{}, fmt.Errorf("ibv: select GID: invalid IP address: %w", verbs.ErrInvalidArgument)
	}
	root := s.root()
	want := verbs.GIDFromAddr(ip)
	noDev := &NoDeviceError{IP: ip}

	ports, err := listPorts(root)
	if err != nil {
		noDev.Err = err
		return Selection{}, noDev
	}

	var best Selection
	found := false
	var ibPorts []portInfo
	for _, p := range ports {
		if p.linkLayer == verbs.LinkLayerInfiniBand {
			ibPorts = append(ibPorts, p)
			continue
		}
		gids, err := readGIDTable(root, p)
		if err != nil {
			return Selection{}, err
		}
		for _, g := range gids {
			if g.GID != want || (g.Type != verbs.GIDTypeRoCEv2 && g.Type != verbs.GIDTypeRoCEv1) {
				continue
			}
			if p.state != verbs.PortActive {
				noDev.Inactive = appendOnce(noDev.Inactive, p.describe())
				continue
			}
			// Candidates arrive in (device, port, index) order, so only a better
			// type replaces an earlier match.
			if !found || (g.Type == verbs.GIDTypeRoCEv2 && best.Type != verbs.GIDTypeRoCEv2) {
				best = Selection{
					Device: p.device, Port: p.num, GIDIndex: g.Index, GID: g.GID,
					Type: g.Type, LinkLayer: p.linkLayer, Netdev: g.Netdev,
				}
				found = true
			}
		}
	}
	if found {
		return best, nil
	}

	if len(ibPorts) > 0 {
		sel, ok, err := s.selectIB(root, ip, ibPorts, noDev)
		if err != nil {
			return Selection{}, err
		}
		if ok {
			return sel, nil
		}
	}
	return Selection{}, noDev
}

// selectIB applies rule 2 of Select to the InfiniBand ports.
func (s Selector) selectIB(root string, ip netip.Addr, ports []portInfo, noDev *NoDeviceError) (Selection, bool, error) {
	netdevOf := s.NetdevOf
	if netdevOf == nil {
		netdevOf = hostNetdevOf
	}
	netdev, err := netdevOf(ip)
	if err != nil || netdev == "" {
		// No interface holds ip: nothing on an IB port can serve it either.
		return Selection{}, false, nil
	}
	for _, p := range ports {
		if !slices.Contains(ipoibNetdevs(root, p), netdev) {
			continue
		}
		if p.state != verbs.PortActive {
			noDev.Inactive = appendOnce(noDev.Inactive, p.describe())
			continue
		}
		gids, err := readGIDTable(root, p)
		if err != nil {
			return Selection{}, false, err
		}
		if len(gids) == 0 {
			continue
		}
		g := gids[0]
		return Selection{
			Device: p.device, Port: p.num, GIDIndex: g.Index, GID: g.GID,
			Type: g.Type, LinkLayer: p.linkLayer, Netdev: netdev,
		}, true, nil
	}
	return Selection{}, false, nil
}

// ReadGIDTable reads the populated entries of a port's GID table from sysfs, in index
// order. Unused (all-zero) entries are left out. The type comes from gid_attrs/types
// ("RoCE v2", or "IB/RoCE v1", which is [verbs.GIDTypeIB] on an InfiniBand port and
// [verbs.GIDTypeRoCEv1] on an Ethernet port); where the kernel has no gid_attrs the
// type follows the link layer the same way, and entries of a type this package does
// not know are left out. Netdev comes from gid_attrs/ndevs, or is "".
func ReadGIDTable(sysfsRoot, device string, port uint8) ([]verbs.GIDEntry, error) {
	root := sysfsRoot
	if root == "" {
		root = DefaultSysfsRoot
	}
	p, err := readPort(root, device, port)
	if err != nil {
		return nil, fmt.Errorf("ibv: %w", err)
	}
	return readGIDTable(root, p)
}

// portInfo is what Select needs to know about one port.
type portInfo struct {
	device    string
	num       uint8
	dir       string // .../class/infiniband/<device>/ports/<num>
	state     verbs.PortState
	stateText string // as sysfs spells it, e.g. "DOWN"
	linkLayer verbs.LinkLayer
	nports    int // ports of the device
}

func (p portInfo) describe() string {
	return fmt.Sprintf("%s port %d (%s)", p.device, p.num, p.stateText)
}

func (s Selector) root() string {
	if s.SysfsRoot == "" {
		return DefaultSysfsRoot
	}
	return s.SysfsRoot
}

func classDir(root string) string { return filepath.Join(root, "class", "infiniband") }

// listPorts returns every port of every device, devices in name order, ports in
// number order.
func listPorts(root string) ([]portInfo, error) {
	devs, err := os.ReadDir(classDir(root))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no %s (no RDMA devices, or no kernel RDMA support)", classDir(root))
		}
		return nil, fmt.Errorf("list RDMA devices: %w", err)
	}
	var ports []portInfo
	for _, d := range devs { // os.ReadDir sorts by name
		if fi, err := os.Stat(filepath.Join(classDir(root), d.Name(), "ports")); err != nil || !fi.IsDir() {
			continue // not a device directory
		}
		nums, err := portNumbers(root, d.Name())
		if err != nil {
			return nil, err
		}
		for _, n := range nums {
			p, err := readPort(root, d.Name(), n)
			if err != nil {
				return nil, err
			}
			p.nports = len(nums)
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// portNumbers lists a device's port numbers in increasing order.
func portNumbers(root, device string) ([]uint8, error) {
	ents, err := os.ReadDir(filepath.Join(classDir(root), device, "ports"))
	if err != nil {
		return nil, fmt.Errorf("list ports of %s: %w", device, err)
	}
	var nums []uint8
	for _, e := range ents {
		n, err := strconv.ParseUint(e.Name(), 10, 8)
		if err != nil || n == 0 {
			continue
		}
		nums = append(nums, uint8(n))
	}
	slices.Sort(nums)
	return nums, nil
}

// readPort reads a port's state and link layer. A port without a link_layer file
// (kernels before RoCE) is InfiniBand; a port whose state cannot be read is
// reported as not active.
func readPort(root, device string, num uint8) (portInfo, error) {
	dir := filepath.Join(classDir(root), device, "ports", strconv.Itoa(int(num)))
	if _, err := os.Stat(dir); err != nil {
		return portInfo{}, fmt.Errorf("port %d of %s: %w", num, device, err)
	}
	p := portInfo{device: device, num: num, dir: dir, state: verbs.PortNop, stateText: "state unknown", nports: 1}
	if s, err := readLine(filepath.Join(dir, "state")); err == nil {
		p.state, p.stateText = parsePortState(s)
	}
	p.linkLayer = verbs.LinkLayerInfiniBand
	if s, err := readLine(filepath.Join(dir, "link_layer")); err == nil {
		switch s {
		case "Ethernet":
			p.linkLayer = verbs.LinkLayerEthernet
		case "InfiniBand":
			p.linkLayer = verbs.LinkLayerInfiniBand
		default:
			p.linkLayer = verbs.LinkLayerUnspecified
		}
	}
	return p, nil
}

// parsePortState parses a ports/N/state file such as "4: ACTIVE".
func parsePortState(s string) (verbs.PortState, string) {
	num, name, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	n, err := strconv.Atoi(strings.TrimSpace(num))
	if !ok || err != nil {
		return verbs.PortNop, s
	}
	return verbs.PortState(n), name
}

// readGIDTable implements ReadGIDTable for a port already read.
//
// The kernel lists every index of the table in gids/ (and in gid_attrs/types/ and
// gid_attrs/ndevs/), populated or not: an unpopulated entry reads as the zero GID
// and its attributes fail to read (Documentation/ABI/stable/sysfs-class-infiniband;
// drivers/infiniband/core/sysfs.c creates one file per index up to the table's
// length). So every gids/ entry is read, each with one open and one read into a
// reused buffer, and the attribute files only for the populated ones. The index
// kept is the file's name, the hardware index, never a position in the result.
func readGIDTable(root string, p portInfo) ([]verbs.GIDEntry, error) {
	gidsDir := filepath.Join(p.dir, "gids")
	ents, err := os.ReadDir(gidsDir)
	if err != nil {
		return nil, fmt.Errorf("ibv: GID table of %s port %d: %w", p.device, p.num, err)
	}
	var (
		table []verbs.GIDEntry
		buf   [64]byte // a GID is 39 characters; attribute values are shorter than 64
		zero  = []byte("0000:0000:0000:0000:0000:0000:0000:0000")
	)
	for _, e := range ents {
		idx, err := strconv.Atoi(e.Name())
		if err != nil || idx < 0 {
			continue
		}
		b, ok := readAttrInto(filepath.Join(gidsDir, e.Name()), buf[:])
		if !ok || bytes.Equal(b, zero) {
			continue // unpopulated: zero, or (some kernels) a failed read
		}
		s := string(b)
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() {
			return nil, fmt.Errorf("ibv: %s port %d GID[%d]: malformed GID %q", p.device, p.num, idx, s)
		}
		gid := verbs.GID(a.As16())
		if gid.IsZero() {
			continue
		}
		ent := verbs.GIDEntry{Index: idx, GID: gid, Type: verbs.GIDTypeIB}
		if p.linkLayer == verbs.LinkLayerEthernet {
			ent.Type = verbs.GIDTypeRoCEv1
		}
		if t, ok := readAttrInto(filepath.Join(p.dir, "gid_attrs", "types", e.Name()), buf[:]); ok {
			switch {
			case bytes.EqualFold(t, []byte("RoCE v2")):
				ent.Type = verbs.GIDTypeRoCEv2
			case bytes.EqualFold(t, []byte("IB/RoCE v1")):
				// keep the link-layer default
			default:
				continue // a type this package does not know cannot be selected
			}
		}
		if nd, ok := readAttrInto(filepath.Join(p.dir, "gid_attrs", "ndevs", e.Name()), buf[:]); ok {
			ent.Netdev = string(nd)
		}
		table = append(table, ent)
	}
	slices.SortFunc(table, func(a, b verbs.GIDEntry) int { return cmp.Compare(a.Index, b.Index) })
	return table, nil
}

// ipoibNetdevs lists the network interfaces that belong to an InfiniBand port, by the
// rule documented on Selector.Select.
func ipoibNetdevs(root string, p portInfo) []string {
	var names []string
	if ents, err := os.ReadDir(filepath.Join(p.dir, "gid_attrs", "ndevs")); err == nil {
		for _, e := range ents {
			if nd, err := readLine(filepath.Join(p.dir, "gid_attrs", "ndevs", e.Name())); err == nil && nd != "" {
				names = appendOnce(names, nd)
			}
		}
	}
	netDir := filepath.Join(classDir(root), p.device, "device", "net")
	ents, err := os.ReadDir(netDir)
	if err != nil {
		return names
	}
	for _, e := range ents {
		s, err := readLine(filepath.Join(netDir, e.Name(), "dev_port"))
		if err != nil {
			if p.nports == 1 {
				names = appendOnce(names, e.Name())
			}
			continue
		}
		if n, err := strconv.Atoi(s); err == nil && n == int(p.num)-1 {
			names = appendOnce(names, e.Name())
		}
	}
	return names
}

// hostNetdevOf names the interface of this host that holds ip.
func hostNetdevOf(ip netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			pfx, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if got, ok := netip.AddrFromSlice(pfx.IP); ok && got.Unmap() == ip {
				return ifc.Name, nil
			}
		}
	}
	return "", nil
}

// readLine reads a one-line sysfs attribute without its trailing newline.
func readLine(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func appendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
