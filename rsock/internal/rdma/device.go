package rdma

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sync"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// device is one opened RDMA device shared by every connection of the process that uses
// it: one context, one protection domain and a growing set of pollers, each owning a CQ.
// It is reference-counted: the last connection to let go closes everything, so that an
// idle process holds no device resources.
type device struct {
	key      deviceKey
	ctx      verbs.Context
	pd       verbs.PD
	attr     verbs.DeviceAttr
	port     verbs.PortAttr
	gidIndex int
	gid      verbs.GID

	mu      sync.Mutex
	refs    int
	conns   int // endpoints admitted
	pollers []*poller
}

// admit counts one more connection on the device, unless limit (if positive) is reached.
func (d *device) admit(limit int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if limit > 0 && d.conns >= limit {
		return false
	}
	d.conns++
	return true
}

// leave undoes admit.
func (d *device) leave() {
	d.mu.Lock()
	d.conns--
	d.mu.Unlock()
}

type deviceKey struct {
	provider verbs.Provider
	name     string
}

var devices = struct {
	sync.Mutex
	open map[deviceKey]*device
}{open: make(map[deviceKey]*device)}

// acquireDevice returns the shared device of provider p that serves local address ip,
// opening it on first use. Each successful call must be paired with release.
func acquireDevice(p verbs.Provider, ip netip.Addr) (*device, error) {
	attrs, err := deviceAttrs(p)
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	devAttr, port, gidIndex, err := selectPort(attrs, ip)
	if err != nil {
		return nil, err
	}
	if !reflect.TypeOf(p).Comparable() {
		// Devices are shared by provider; a provider must be usable as a map key.
		return nil, fmt.Errorf("provider %s of type %T is not comparable: use a pointer", p.Name(), p)
	}
	key := deviceKey{provider: p, name: devAttr.Name}

	devices.Lock()
	defer devices.Unlock()
	if d := devices.open[key]; d != nil {
		d.mu.Lock()
		d.refs++
		d.mu.Unlock()
		return d, nil
	}
	ctx, err := p.Open(devAttr.Name)
	if err != nil {
		return nil, fmt.Errorf("open device %s: %w", devAttr.Name, err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		ctx.Close()
		return nil, fmt.Errorf("allocate protection domain on %s: %w", devAttr.Name, err)
	}
	d := &device{
		key: key, ctx: ctx, pd: pd, attr: devAttr, port: port, refs: 1,
		gidIndex: gidIndex, gid: port.GIDs[gidIndex].GID,
	}
	devices.open[key] = d
	return d, nil
}

// attrCacheTTL is how long a provider's device list is reused. Listing devices can be
// costly (rdma-core opens each device and queries it), and connections are set up far
// more often than ports change state.
const attrCacheTTL = 5 * time.Second

var attrCache = struct {
	sync.Mutex
	byProvider map[verbs.Provider]cachedAttrs
}{byProvider: make(map[verbs.Provider]cachedAttrs)}

type cachedAttrs struct {
	attrs []verbs.DeviceAttr
	until time.Time
}

// deviceAttrs returns p.Devices(), cached for attrCacheTTL. Errors are not cached.
func deviceAttrs(p verbs.Provider) ([]verbs.DeviceAttr, error) {
	if !reflect.TypeOf(p).Comparable() {
		return p.Devices()
	}
	now := time.Now()
	attrCache.Lock()
	c, ok := attrCache.byProvider[p]
	attrCache.Unlock()
	if ok && now.Before(c.until) {
		return c.attrs, nil
	}
	attrs, err := p.Devices()
	if err != nil {
		return nil, err
	}
	attrCache.Lock()
	for k, v := range attrCache.byProvider { // drop expired providers (tests make many)
		if now.After(v.until) {
			delete(attrCache.byProvider, k)
		}
	}
	attrCache.byProvider[p] = cachedAttrs{attrs: attrs, until: now.Add(attrCacheTTL)}
	attrCache.Unlock()
	return attrs, nil
}

// release drops one reference, closing the device with the last one.
func (d *device) release() error {
	devices.Lock()
	defer devices.Unlock()
	d.mu.Lock()
	d.refs--
	last := d.refs == 0
	pollers := d.pollers
	if last {
		d.pollers = nil
	}
	d.mu.Unlock()
	if !last {
		return nil
	}
	delete(devices.open, d.key)
	var errs []error
	for _, p := range pollers {
		errs = append(errs, p.close())
	}
	errs = append(errs, d.pd.Close(), d.ctx.Close())
	return errors.Join(errs...)
}

// pollerFor returns a poller whose CQ has room for entries more completions, creating a
// new CQ when every existing one is fully promised. The entries are reserved; the caller
// returns them with poller.unreserve.
func (d *device) pollerFor(entries, cqSize, spin int) (*poller, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pollers {
		if p.reserve(entries) {
			return p, nil
		}
	}
	if cqSize < entries {
		cqSize = entries
	}
	if max := d.attr.MaxCQE; max > 0 && cqSize > max {
		cqSize = max
	}
	p, err := newPoller(d.ctx, cqSize, spin)
	if err != nil {
		return nil, err
	}
	if !p.reserve(entries) {
		p.close()
		return nil, fmt.Errorf("a CQ of %d entries cannot hold a connection's %d", cqSize, entries)
	}
	d.pollers = append(d.pollers, p)
	return p, nil
}

// selectPort chooses the device, active port and GID index to use for connections
// whose bootstrap connection runs from local address ip. A RoCE GID holding ip wins
// (RoCE v2 over v1); otherwise the first active InfiniBand port, addressed by GID 0
// and LID, serves any IP (IPoIB or a software fabric).
func selectPort(devs []verbs.DeviceAttr, ip netip.Addr) (verbs.DeviceAttr, verbs.PortAttr, int, error) {
	ip = ip.Unmap()
	type choice struct {
		dev   int
		port  int
		gid   int
		score int
	}
	best := choice{score: -1}
	for di, d := range devs {
		for pi, p := range d.Ports {
			if p.State != verbs.PortActive {
				continue
			}
			for gi, g := range p.GIDs {
				if g.GID.IsZero() {
					continue
				}
				score := -1
				switch {
				case p.LinkLayer == verbs.LinkLayerEthernet && g.GID.Addr() == ip && g.Type == verbs.GIDTypeRoCEv2:
					score = 3
				case p.LinkLayer == verbs.LinkLayerEthernet && g.GID.Addr() == ip:
					score = 2
				case p.LinkLayer != verbs.LinkLayerEthernet && gi == 0:
					score = 1
				}
				if score > best.score {
					best = choice{dev: di, port: pi, gid: gi, score: score}
				}
			}
		}
	}
	if best.score < 0 {
		return verbs.DeviceAttr{}, verbs.PortAttr{}, 0, fmt.Errorf("%w: no active port serves %s", verbs.ErrNoDevice, ip)
	}
	d := devs[best.dev]
	return d, d.Ports[best.port], best.gid, nil
}
