package verbstest

import (
	"fmt"
	"net/netip"

	"github.com/rsockio/rsock/verbs"
)

// OnAddr returns provider p narrowed to the host that owns IP address ip: its Devices list
// only the device whose port has a RoCE v2 GID holding ip, with that port alone, and that
// port's GID table reduced to the GIDs holding ip. The entries keep their hardware index
// (GID tables have holes, so a position in the reduced list would name the wrong GID).
// Two hosts on one machine (network namespaces joined by veth) are told apart this way.
// If p injects faults (see [Faults]), so does the result.
func OnAddr(p verbs.Provider, ip netip.Addr) (verbs.Provider, error) {
	ap := &addrProvider{Provider: p, ip: ip.Unmap()}
	if _, err := ap.Devices(); err != nil {
		return nil, err
	}
	if f, ok := p.(Faults); ok {
		return struct {
			*addrProvider
			Faults
		}{ap, f}, nil
	}
	return ap, nil
}

type addrProvider struct {
	verbs.Provider
	ip netip.Addr
}

func (p *addrProvider) Devices() ([]verbs.DeviceAttr, error) {
	devs, err := p.Provider.Devices()
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		for _, port := range d.Ports {
			var gids []verbs.GIDEntry
			for _, g := range port.GIDs {
				if g.Type == verbs.GIDTypeRoCEv2 && g.GID.Addr() == p.ip {
					gids = append(gids, g)
				}
			}
			if len(gids) > 0 {
				port.GIDs = gids
				d.Ports = []verbs.PortAttr{port}
				return []verbs.DeviceAttr{d}, nil
			}
		}
	}
	return nil, fmt.Errorf("verbstest: %s: no device has a RoCE v2 GID for %v among %d devices: %w", p.Name(), p.ip, len(devs), verbs.ErrNoDevice)
}
