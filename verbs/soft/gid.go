package soft

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/rsockio/rsock/verbs"
)

// maxGIDTable bounds the hardware indices of a configured GID table, as a device's
// table length does (rxe has 1,024 entries; the address vector names only 256).
const maxGIDTable = 1 << 16

// PortConfig describes the port of one soft device, to model what real hosts have and a
// default soft device does not: GID tables with holes (entries keep their hardware
// index when the addresses before them are deleted), several addresses on one port,
// InfiniBand ports found by their IPoIB netdev, ports that are not ACTIVE.
//
// A QP's address vector names its source GID by hardware index
// ([verbs.AddressVector.SGIDIndex]). As on a kernel device, ToRTR fails when the index
// names an empty entry (rxe: ENODATA, seen in the VM with the index taken as a position
// among the populated entries), and requests go out from the GID the index names: a
// responder connected to another GID of the requester (the one it was told) drops
// them, as rxe drops a packet whose source address is not the peer's.
type PortConfig struct {
	// LinkLayer is Ethernet (RoCE) when zero.
	LinkLayer verbs.LinkLayer
	// State is ACTIVE when zero. Soft reports it; it does not change how QPs behave.
	State verbs.PortState
	// LID is the port's LID (InfiniBand).
	LID uint16
	// GIDs is the port's GID table: each entry sits at its Index, in [0, 65536), and
	// indices need not be contiguous. Entries must have distinct indices and non-zero
	// GIDs. nil means the default table (see [Options].Devices).
	GIDs []verbs.GIDEntry
	// Netdevs are the port's network interfaces ([verbs.PortAttr.Netdevs]). nil means
	// the netdevs the GIDs name.
	Netdevs []string
}

// defaultGIDs is the table of device i without a PortConfig: its link-local GID (from
// its node GUID) at index 0 and 127.0.0.(i+1) at index 1, both RoCE v2 on lo.
func defaultGIDs(i int, guid uint64) []verbs.GIDEntry {
	var local verbs.GID
	local[0], local[1] = 0xfe, 0x80
	for b := range 8 {
		local[8+b] = byte(guid >> (56 - 8*b))
	}
	ip := netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)})
	return []verbs.GIDEntry{
		{Index: 0, GID: local, Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
		{Index: 1, GID: verbs.GIDFromAddr(ip), Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
	}
}

// portAttr returns the port of device i (node GUID guid) as opts configure it.
func portAttr(opts Options, i int, guid uint64) (verbs.PortAttr, error) {
	var c PortConfig
	if i < len(opts.Ports) {
		c = opts.Ports[i]
	}
	p := verbs.PortAttr{
		Num:       1,
		State:     c.State,
		MaxMTU:    verbs.MTU4096,
		ActiveMTU: verbs.MTU4096,
		LID:       c.LID,
		LinkLayer: c.LinkLayer,
		GIDs:      slices.Clone(c.GIDs),
		Netdevs:   slices.Clone(c.Netdevs),
	}
	if p.State == 0 {
		p.State = verbs.PortActive
	}
	if p.LinkLayer == verbs.LinkLayerUnspecified {
		p.LinkLayer = verbs.LinkLayerEthernet
	}
	if p.GIDs == nil {
		p.GIDs = defaultGIDs(i, guid)
	}
	seen := make(map[int]bool, len(p.GIDs))
	for _, g := range p.GIDs {
		switch {
		case g.Index < 0 || g.Index >= maxGIDTable:
			return p, fmt.Errorf("soft: device %d: GID index %d outside [0, %d): %w", i, g.Index, maxGIDTable, verbs.ErrInvalidArgument)
		case seen[g.Index]:
			return p, fmt.Errorf("soft: device %d: GID index %d given twice: %w", i, g.Index, verbs.ErrInvalidArgument)
		case g.GID.IsZero():
			return p, fmt.Errorf("soft: device %d: GID index %d is the zero GID, an empty entry: %w", i, g.Index, verbs.ErrInvalidArgument)
		}
		seen[g.Index] = true
	}
	slices.SortFunc(p.GIDs, func(a, b verbs.GIDEntry) int { return a.Index - b.Index })
	if p.Netdevs == nil {
		for _, g := range p.GIDs {
			if g.Netdev != "" && !slices.Contains(p.Netdevs, g.Netdev) {
				p.Netdevs = append(p.Netdevs, g.Netdev)
			}
		}
	}
	return p, nil
}

// gidAt returns the entry of p's table at hardware index idx.
func gidAt(p verbs.PortAttr, idx uint8) (verbs.GIDEntry, bool) {
	for _, g := range p.GIDs {
		if g.Index == int(idx) {
			return g, true
		}
	}
	return verbs.GIDEntry{}, false
}
