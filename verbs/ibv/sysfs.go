package ibv

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/rsockio/rsock/verbs"
)

// DefaultSysfsRoot is where sysfs is mounted on Linux.
const DefaultSysfsRoot = "/sys"

// ReadGIDTable reads the populated entries of a port's GID table from sysfs, in index
// order. Unused (all-zero) entries are left out. The type comes from gid_attrs/types
// ("RoCE v2", or "IB/RoCE v1", which is [verbs.GIDTypeIB] on an InfiniBand port and
// [verbs.GIDTypeRoCEv1] on an Ethernet port); where the kernel has no gid_attrs the
// type follows the link layer the same way, and entries of a type this package does
// not know are left out. Netdev comes from gid_attrs/ndevs, or is "".
func ReadGIDTable(sysfsRoot, device string, port uint8) ([]verbs.GIDEntry, error) {
	gids, err := readPortGIDTable(sysfsRoot, device, port)
	if err != nil {
		return nil, fmt.Errorf("ibv: %w", err)
	}
	return gids, nil
}

// readPortGIDTable is ReadGIDTable without the package's prefix on its errors.
func readPortGIDTable(root, device string, port uint8) ([]verbs.GIDEntry, error) {
	if root == "" {
		root = DefaultSysfsRoot
	}
	p, err := readPort(root, device, port)
	if err != nil {
		return nil, err
	}
	return readGIDTable(root, p)
}

// portInfo is what sysfs says about one port, besides its GID table.
type portInfo struct {
	device    string
	num       uint8
	dir       string // .../class/infiniband/<device>/ports/<num>
	state     verbs.PortState
	linkLayer verbs.LinkLayer
	lid       uint16
}

func classDir(root string) string { return filepath.Join(root, "class", "infiniband") }

// listPorts returns every port of every device, devices in name order, ports in
// number order.
func listPorts(root string) ([]portInfo, error) {
	devs, err := readDir(classDir(root))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no %s (no RDMA devices, or no kernel RDMA support)", classDir(root))
		}
		return nil, fmt.Errorf("list RDMA devices: %w", err)
	}
	var ports []portInfo
	for _, d := range devs { // readDir sorts by name
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
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// portNumbers lists a device's port numbers in increasing order.
func portNumbers(root, device string) ([]uint8, error) {
	ents, err := readDir(filepath.Join(classDir(root), device, "ports"))
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
// reported as not active. A process out of descriptors gets an error (optionalLine).
func readPort(root, device string, num uint8) (portInfo, error) {
	dir := filepath.Join(classDir(root), device, "ports", strconv.Itoa(int(num)))
	if _, err := os.Stat(dir); err != nil {
		return portInfo{}, fmt.Errorf("port %d of %s: %w", num, device, err)
	}
	p := portInfo{device: device, num: num, dir: dir, state: verbs.PortNop}
	s, ok, err := optionalLine(filepath.Join(dir, "state"))
	if err != nil {
		return portInfo{}, fmt.Errorf("port %d of %s: %w", num, device, err)
	}
	if ok {
		p.state, _ = parsePortState(s)
	}
	if s, ok, err = optionalLine(filepath.Join(dir, "lid")); err != nil {
		return portInfo{}, fmt.Errorf("port %d of %s: %w", num, device, err)
	}
	if ok {
		if n, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 16); err == nil {
			p.lid = uint16(n)
		}
	}
	p.linkLayer = verbs.LinkLayerInfiniBand
	if s, ok, err = optionalLine(filepath.Join(dir, "link_layer")); err != nil {
		return portInfo{}, fmt.Errorf("port %d of %s: %w", num, device, err)
	}
	if ok {
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
// kept is the file's name, the hardware index, never a position in the result. A file
// that cannot be opened for want of descriptors fails the read (isOutOfFiles): taken
// for an unpopulated entry, it would empty the table of a process short of files, and
// its connections would fall back saying that no port serves their address.
func readGIDTable(root string, p portInfo) ([]verbs.GIDEntry, error) {
	gidsDir := filepath.Join(p.dir, "gids")
	ents, err := readDir(gidsDir)
	if err != nil {
		return nil, fmt.Errorf("GID table of %s port %d: %w", p.device, p.num, err)
	}
	var (
		table []verbs.GIDEntry
		buf   [64]byte // a GID is 39 characters; attribute values are shorter than 64
		zero  = []byte("0000:0000:0000:0000:0000:0000:0000:0000")
		files error // the first read that failed for want of descriptors
	)
	read := func(path string) ([]byte, bool) {
		b, err := readAttrInto(path, buf[:])
		if files == nil && isOutOfFiles(err) {
			files = err
		}
		return b, err == nil
	}
	for _, e := range ents {
		if files != nil {
			break
		}
		idx, err := strconv.Atoi(e.Name())
		if err != nil || idx < 0 {
			continue
		}
		b, ok := read(filepath.Join(gidsDir, e.Name()))
		if !ok || bytes.Equal(b, zero) {
			continue // unpopulated: zero, or (some kernels) a failed read
		}
		s := string(b)
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() {
			return nil, fmt.Errorf("%s port %d GID[%d]: malformed GID %q", p.device, p.num, idx, s)
		}
		gid := verbs.GID(a.As16())
		if gid.IsZero() {
			continue
		}
		ent := verbs.GIDEntry{Index: idx, GID: gid, Type: verbs.GIDTypeIB}
		if p.linkLayer == verbs.LinkLayerEthernet {
			ent.Type = verbs.GIDTypeRoCEv1
		}
		if t, ok := read(filepath.Join(p.dir, "gid_attrs", "types", e.Name())); ok {
			switch {
			case bytes.EqualFold(t, []byte("RoCE v2")):
				ent.Type = verbs.GIDTypeRoCEv2
			case bytes.EqualFold(t, []byte("IB/RoCE v1")):
				// keep the link-layer default
			default:
				continue // a type this package does not know cannot be selected
			}
		}
		if nd, ok := read(filepath.Join(p.dir, "gid_attrs", "ndevs", e.Name())); ok {
			ent.Netdev = string(nd)
		}
		table = append(table, ent)
	}
	if files != nil {
		return nil, fmt.Errorf("GID table of %s port %d: %w", p.device, p.num, files)
	}
	slices.SortFunc(table, func(a, b verbs.GIDEntry) int { return cmp.Compare(a.Index, b.Index) })
	return table, nil
}

// sysfsDevices describes every device from sysfs alone, devices in name order: name,
// transport, and per port the state, link layer, LID, GID table and netdevs (what the
// selector, verbs.Selector, reads). Limits come from ibv_query_device and stay zero.
// The provider's Devices fills the same sysfs fields through addSysfsAttrs; tests feed
// fake trees through this function to the selector.
func sysfsDevices(root string) ([]verbs.DeviceAttr, error) {
	ports, err := listPorts(root)
	if err != nil {
		return nil, err
	}
	var devs []verbs.DeviceAttr
	for _, p := range ports {
		if len(devs) == 0 || devs[len(devs)-1].Name != p.device {
			devs = append(devs, verbs.DeviceAttr{Name: p.device})
		}
		gids, err := readGIDTable(root, p)
		if err != nil {
			return nil, err
		}
		d := &devs[len(devs)-1]
		d.Ports = append(d.Ports, verbs.PortAttr{Num: p.num, State: p.state, LinkLayer: p.linkLayer, LID: p.lid, GIDs: gids})
	}
	for i := range devs {
		if err := addSysfsAttrs(root, &devs[i]); err != nil {
			return nil, err
		}
	}
	return devs, nil
}

// addSysfsAttrs fills the fields of attr that only sysfs knows: the device's transport
// (node_type), whether it is Soft-RoCE (readSoftRoCE) and each port's netdevs
// (portNetdevs). The GID tables must be filled. It fails only for want of descriptors.
func addSysfsAttrs(root string, attr *verbs.DeviceAttr) error {
	var err error
	if attr.Transport, err = readTransport(root, attr.Name); err != nil {
		return fmt.Errorf("transport of %s: %w", attr.Name, err)
	}
	attr.SoftRoCE = readSoftRoCE(root, attr.Name)
	for i := range attr.Ports {
		p := &attr.Ports[i]
		if p.Netdevs, err = portNetdevs(root, attr.Name, p.Num, len(attr.Ports), p.GIDs); err != nil {
			return fmt.Errorf("netdevs of %s port %d: %w", attr.Name, p.Num, err)
		}
	}
	return nil
}

// readTransport reads a device's node_type ("1: CA", "4: RNIC"; the kernel's enum
// rdma_node_type). A device without the file is TransportUnspecified.
func readTransport(root, device string) (verbs.Transport, error) {
	s, ok, err := optionalLine(filepath.Join(classDir(root), device, "node_type"))
	if !ok {
		return verbs.TransportUnspecified, err
	}
	num, _, _ := strings.Cut(s, ":")
	switch strings.TrimSpace(num) {
	case "1": // RDMA_NODE_IB_CA: InfiniBand and RoCE
		return verbs.TransportIB, nil
	case "4": // RDMA_NODE_RNIC: iWARP
		return verbs.TransportIWARP, nil
	}
	return verbs.TransportOther, nil
}

// readSoftRoCE reports whether a device is the kernel's Soft-RoCE (rdma_rxe): rxe names
// the netdev it runs over in a parent attribute, which no hardware driver has. (A
// hardware device also has a device link to its bus device, which rxe lacks; the
// attribute is the positive sign, so that no hardware device is taken for software.)
// Soft-iWARP (siw) is not looked for: the selector refuses iWARP.
func readSoftRoCE(root, device string) bool {
	_, err := os.Stat(filepath.Join(classDir(root), device, "parent"))
	return err == nil
}

// portNetdevs lists the network interfaces of port num of device (nports ports): the
// netdevs its GID entries name (RoCE, and IPoIB where the kernel names them), then the
// interfaces of the device's PCI function (device/net/<ifname>) whose dev_port file
// (0-based) is num-1; an interface without dev_port belongs to a single-port device's
// only port. The second source is how an IPoIB interface is found on InfiniBand ports,
// whose GID entries name no netdev on most kernels. It fails only for want of
// descriptors: a missing directory or file is a device without them.
func portNetdevs(root, device string, num uint8, nports int, gids []verbs.GIDEntry) ([]string, error) {
	var names []string
	for _, g := range gids {
		if g.Netdev != "" {
			names = appendOnce(names, g.Netdev)
		}
	}
	netDir := filepath.Join(classDir(root), device, "device", "net")
	ents, err := readDir(netDir)
	if err != nil {
		if isOutOfFiles(err) {
			return nil, err
		}
		return names, nil
	}
	for _, e := range ents {
		s, ok, err := optionalLine(filepath.Join(netDir, e.Name(), "dev_port"))
		if err != nil {
			return nil, err
		}
		if !ok {
			if nports == 1 {
				names = appendOnce(names, e.Name())
			}
			continue
		}
		if n, err := strconv.Atoi(s); err == nil && n == int(num)-1 {
			names = appendOnce(names, e.Name())
		}
	}
	return names, nil
}

// optionalLine reads a one-line sysfs attribute without its trailing newline. ok is
// false when the attribute cannot be read: not there, or (for some attributes) not
// readable on this kernel, which callers take as its absence. err is set only when
// the process or the system is out of descriptors (isOutOfFiles): that says nothing
// about the attribute, and callers report it instead.
func optionalLine(path string) (s string, ok bool, err error) {
	b, err := readFile(path)
	if err != nil {
		if isOutOfFiles(err) {
			return "", false, err
		}
		return "", false, nil
	}
	return strings.TrimSpace(string(b)), true, nil
}

// openFault, when not nil, is called before each sysfs file or directory is opened,
// and an error it returns stands for the open's. Tests set it to fail one open with
// EMFILE: the reader holds one descriptor at a time, so a process short of them gets
// EMFILE only when its other threads hold the rest at that moment.
var openFault func(path string) error

// readDir is os.ReadDir, through openFault.
func readDir(dir string) ([]os.DirEntry, error) {
	if openFault != nil {
		if err := openFault(dir); err != nil {
			return nil, err
		}
	}
	return os.ReadDir(dir)
}

// readFile is os.ReadFile, through openFault.
func readFile(path string) ([]byte, error) {
	if openFault != nil {
		if err := openFault(path); err != nil {
			return nil, err
		}
	}
	return os.ReadFile(path)
}

// isOutOfFiles reports whether err is the process's (EMFILE) or the system's (ENFILE)
// want of file descriptors.
func isOutOfFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

func appendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
