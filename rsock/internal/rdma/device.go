package rdma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sync"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// device is one opened RDMA device shared by every connection of the process that uses
// it: one context and a growing set of pollers, each owning a CQ. It holds no protection
// domain: each connection allocates its own (see "Isolation" in the package docs), so
// that no peer can reach another connection's memory. It is reference-counted: when the
// last connection lets go, the device stays warm (open, with one CQ, no goroutine) for
// deviceIdleTimeout, so that the next connection skips opening it, creating and clearing
// a CQ and listing the devices; then it closes, so that an idle process holds no device
// resources for long (see warm.go).
//
// The device holds no port or GID: those belong to each connection ([portPath]), chosen
// by the connection's own local IP, since connections from different local addresses
// (subnets, VLANs) of one port need different source GIDs.
type device struct {
	key  deviceKey
	attr verbs.DeviceAttr

	// ready is closed when the opening goroutine has finished; ctx and openErr are
	// written before and only read after.
	ready   chan struct{}
	openErr error
	ctx     verbs.Context

	refs int // guarded by devices

	// Guarded by devices: the device is warm and unused, since idleSeq (for picking
	// the longest idle), until idleUntil; idleTimer closes it then (warm.go).
	idle      bool
	idleSeq   uint64
	idleUntil time.Time
	idleTimer *time.Timer

	mu      sync.Mutex
	conns   int // endpoints admitted
	pollers []*poller

	events deviceEvents // the async event listener (events.go)

	shells []shell // pooled endpoint shells (pool.go), guarded by devices
}

// portPath is where one connection leaves its device: the port and the source GID
// (with its hardware index in the port's GID table) serving its local IP.
type portPath struct {
	port verbs.PortAttr
	gid  verbs.GIDEntry
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

// devices holds the open devices and the ones being opened. Its lock also guards
// every device's refs.
var devices = struct {
	sync.Mutex
	open map[deviceKey]*device
}{open: make(map[deviceKey]*device)}

// acquireDevice returns the shared device of provider p that serves local address ip,
// opening it on first use, and the port and GID the connection uses on it, as sel (the
// one selector, verbs.Selector) chooses them from the provider's device list. Each
// successful call must be paired with release.
//
// It honours ctx at every step that can block: the device listing and the opening both
// run in goroutines of their own that callers wait for, together (concurrent callers
// share one listing and one opening) and only as long as ctx lasts. A caller whose ctx
// ends gets ctx.Err(); the step it gave up on completes in the background, and a device
// opened for nobody is closed at once.
func acquireDevice(ctx context.Context, p verbs.Provider, ip netip.Addr, sel verbs.Selector) (*device, portPath, error) {
	if !reflect.TypeOf(p).Comparable() {
		// Devices are shared by provider; a provider must be usable as a map key.
		return nil, portPath{}, fmt.Errorf("provider %s of type %T is not comparable: use a pointer", p.Name(), p)
	}
	attrs, err := deviceAttrs(ctx, p)
	if err != nil {
		return nil, portPath{}, fmt.Errorf("list devices: %w", err)
	}
	chosen, err := sel.Select(attrs, ip)
	if err != nil {
		return nil, portPath{}, err
	}
	devAttr, path := chosen.Device, portPath{port: chosen.Port, gid: chosen.GID}
	key := deviceKey{provider: p, name: devAttr.Name}

	devices.Lock()
	delete(idleDevices.cooled, p) // warm.go: a connection on p warms it again
	d := devices.open[key]
	if d != nil && d.idle {
		d.wake() // warm.go
	}
	if d == nil || d.events.fatal.Load() {
		d = &device{key: key, attr: devAttr, ready: make(chan struct{})}
		devices.open[key] = d
		go d.open(p)
	}
	d.refs++
	devices.Unlock()

	if !isClosed(d.ready) { // a warm device is ready: ctx.Done need not be made
		select {
		case <-d.ready:
		case <-ctx.Done():
			d.release()
			return nil, portPath{}, ctx.Err()
		}
	}
	if d.openErr != nil {
		d.release()
		return nil, portPath{}, d.openErr
	}
	return d, path, nil
}

// open opens the device, then wakes the callers of acquireDevice waiting for it. A
// failed opening leaves the table, so that the next caller tries again; a device every
// waiter gave up on is closed.
func (d *device) open(p verbs.Provider) {
	ctx, err := p.Open(d.key.name)
	if err != nil {
		err = fmt.Errorf("open device %s: %w", d.key.name, err)
	}
	devices.Lock()
	d.ctx, d.openErr = ctx, err
	abandoned := err == nil && d.refs == 0
	if (err != nil || abandoned) && devices.open[d.key] == d {
		delete(devices.open, d.key)
	}
	if err == nil && !abandoned {
		d.events.start(d)
	}
	close(d.ready)
	devices.Unlock()
	if abandoned {
		ctx.Close()
	}
}

// attrCacheTTL is how long a provider's device list is reused. Listing devices can be
// costly (rdma-core opens each device and queries it, and reads each port's GID table
// from sysfs), and connections are set up far more often than ports change state.
const attrCacheTTL = 5 * time.Second

// attrCache holds, per provider, the latest device listing: finished and fresh, or in
// flight. Callers that arrive while a listing is in flight wait for that one instead of
// starting their own, so that a burst of dials on a cold cache lists devices once.
var attrCache = struct {
	sync.Mutex
	byProvider map[verbs.Provider]*attrListing
}{byProvider: make(map[verbs.Provider]*attrListing)}

// attrListing is one call of a provider's Devices method.
type attrListing struct {
	done chan struct{} // closed when the call has returned; the fields below are then set

	attrs []verbs.DeviceAttr
	err   error

	finished bool      // guarded by attrCache: done is closed
	until    time.Time // guarded by attrCache: when a successful listing goes stale
}

// deviceAttrs returns p.Devices(), cached for attrCacheTTL while a device of p is open
// (its event listener drops the listing on any port change, events.go; with none open,
// nothing would, and a finished listing is not reused) and shared by concurrent
// callers; it returns ctx.Err() if ctx ends first. Errors are not cached: the callers
// that shared a failed listing all get its error, and the next caller lists again.
// p must be comparable.
func deviceAttrs(ctx context.Context, p verbs.Provider) ([]verbs.DeviceAttr, error) {
	now := time.Now()
	attrCache.Lock()
	l := attrCache.byProvider[p]
	if l == nil || (l.finished && (!now.Before(l.until) || !listened(p))) {
		for k, v := range attrCache.byProvider { // drop stale providers (tests make many)
			if v.finished && !now.Before(v.until) {
				delete(attrCache.byProvider, k)
			}
		}
		l = &attrListing{done: make(chan struct{})}
		attrCache.byProvider[p] = l
		go l.run(p)
	}
	attrCache.Unlock()
	if isClosed(l.done) { // a cached listing: ctx.Done need not be made
		return l.attrs, l.err
	}
	select {
	case <-l.done:
		return l.attrs, l.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run lists p's devices and publishes the outcome to the listing's waiters.
func (l *attrListing) run(p verbs.Provider) {
	attrs, err := p.Devices()
	attrCache.Lock()
	l.attrs, l.err = attrs, err
	l.finished = true
	l.until = time.Now().Add(attrCacheTTL)
	if err != nil && attrCache.byProvider[p] == l {
		delete(attrCache.byProvider, p)
	}
	close(l.done)
	attrCache.Unlock()
}

// release drops one reference. With the last one, the device goes idle (warm.go), or
// closes if it cannot be reused. A device still being opened is left to its opening
// goroutine, which closes it if nobody wants it.
func (d *device) release() error {
	devices.Lock()
	d.refs--
	if d.refs > 0 {
		devices.Unlock()
		return nil
	}
	select {
	case <-d.ready:
	default:
		devices.Unlock()
		return nil // open closes it
	}
	if d.openErr != nil {
		devices.Unlock()
		return nil // never opened; open took it out of the table
	}
	defer devices.Unlock()
	if d.keepsWarm() {
		return d.sleep() // warm.go
	}
	return d.closeLocked()
}

// closeLocked closes the unused device, with devices locked: closing under the lock
// keeps a new acquireDevice from opening the same device while this one is being torn
// down.
func (d *device) closeLocked() error {
	if devices.open[d.key] == d {
		delete(devices.open, d.key)
	}
	uncoolLocked(d.key.provider) // warm.go
	d.events.stop()
	d.mu.Lock()
	pollers := d.pollers
	d.pollers = nil
	d.mu.Unlock()
	errs := []error{d.closeShellsLocked()} // pool.go: before the context they live in
	for _, p := range pollers {
		errs = append(errs, p.close())
	}
	errs = append(errs, d.ctx.Close())
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
	// Round-robin over the completion vectors, so that the CQs' interrupts (and the
	// pollers they wake) spread over the CPUs the device spreads its vectors over.
	p, err := newPoller(d.ctx, cqSize, spin, len(d.pollers)%max(d.attr.NumCompVectors, 1))
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
