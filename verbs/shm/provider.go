package shm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// Device limits every shm device reports and enforces.
const (
	maxQP         = 1 << 16
	maxQPWR       = 16384
	maxSGE        = 30
	maxCQ         = 1 << 16
	maxCQE        = 1<<22 - 1
	maxMR         = 1 << 16
	maxRegionSize = 1 << 34
	maxInline     = 256
	compVectors   = 1

	qpnMask = 1<<24 - 1
)

const validAccess = rc.ValidAccess

// limits are the device's capacities that the RC core's checks hold requests to.
var limits = rc.Limits{
	MaxQPWR:   maxQPWR,
	MaxSGE:    maxSGE,
	MaxInline: maxInline,
	MaxCQE:    maxCQE,
	MaxMTU:    verbs.MTU4096,
	Vectors:   compVectors,
}

// Options configure a [Provider]. The zero value gives one device that accepts peers of
// the same user only.
type Options struct {
	// Devices is how many devices the provider has, named shm0, shm1, ... Values below 1
	// mean 1. Each device listens on a Unix socket of its own; QPs of two devices, of one
	// process or of two, connect through it.
	Devices int
	// AllowUIDs lists user IDs, besides the process's own, whose processes may connect
	// to this provider's devices (checked with SO_PEERCRED).
	AllowUIDs []uint32
}

// Provider is a set of shm devices: a [verbs.Provider] whose QPs reach QPs of other
// processes on the same host (or of the same process) through shared memory.
type Provider struct {
	devices []*device
	allow   map[uint32]bool

	allocFail [len(allocKinds)]atomic.Int64 // pending injected allocation failures (faults.go)

	mu      sync.Mutex
	closers map[io.Closer]struct{} // QP listeners, each closing the connections it accepted
	closed  bool
	wg      sync.WaitGroup // accept loops and the connections they serve
}

var (
	_ verbs.Provider    = (*Provider)(nil)
	_ verbs.Context     = (*Context)(nil)
	_ verbs.PD          = (*PD)(nil)
	_ verbs.MR          = (*MR)(nil)
	_ verbs.CQ          = (*CQ)(nil)
	_ verbs.CompChannel = (*CompChannel)(nil)
	_ verbs.QP          = (*QP)(nil)
)

// device is one shm device: its attributes, its listener and its QPs and regions.
type device struct {
	p    *Provider
	attr verbs.DeviceAttr

	qpMu sync.RWMutex
	qps  map[uint32]*QP // the device's live QPs

	// mrMu is held for reading while a region's memory is in use, so that
	// deregistering waits for those uses before it unmaps the memory.
	mrMu sync.RWMutex
	mrs  rc.KeyTable // the live regions; never gives a key twice, as a peer may hold one

	nQP, nCQ, nMR atomic.Int64

	port atomic.Int32 // the port's verbs.PortState as SetPortState set it; 0 is active

	ctxMu    sync.Mutex
	contexts map[*Context]struct{}
}

// New returns a provider with the devices opts describes, each listening on an abstract
// Unix socket named after its GID. Close stops them.
func New(opts Options) (*Provider, error) {
	n := max(opts.Devices, 1)
	p := &Provider{allow: map[uint32]bool{uint32(os.Getuid()): true}, closers: map[io.Closer]struct{}{}}
	for _, u := range opts.AllowUIDs {
		p.allow[u] = true
	}
	port, err := hostPort()
	if err != nil {
		return nil, err
	}
	for i := range n {
		p.devices = append(p.devices, newDevice(p, i, port))
	}
	return p, nil
}

func newDevice(p *Provider, i int, port verbs.PortAttr) *device {
	d := &device{
		p:        p,
		qps:      map[uint32]*QP{},
		contexts: map[*Context]struct{}{},
	}
	d.mrs.NeverReuse()
	var guid [8]byte
	rand.Read(guid[:])
	d.attr = verbs.DeviceAttr{
		Name: fmt.Sprintf("shm%d", i), NodeGUID: le.Uint64(guid[:]),
		MaxQP: maxQP, MaxQPWR: maxQPWR, MaxSGE: maxSGE, MaxCQ: maxCQ, MaxCQE: maxCQE,
		MaxMR: maxMR, MaxMRSize: maxRegionSize, MaxInline: maxInline,
		NumCompVectors: compVectors,
		Ports:          []verbs.PortAttr{port},
	}
	return d
}

// hostPort returns the port every shm device has: active, Ethernet, with a RoCE v2 GID
// for each IP address of the host's interfaces (so that a connection finds the device
// by its local address, as it finds a RoCE NIC), loopback first.
func hostPort() (verbs.PortAttr, error) {
	port := verbs.PortAttr{Num: 1, State: verbs.PortActive, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU4096,
		LinkLayer: verbs.LinkLayerEthernet}
	add := func(a netip.Addr, netdev string) {
		g := verbs.GIDFromAddr(a.WithZone(""))
		for _, e := range port.GIDs {
			if e.GID == g {
				return
			}
		}
		port.GIDs = append(port.GIDs, verbs.GIDEntry{Index: len(port.GIDs), GID: g, Type: verbs.GIDTypeRoCEv2, Netdev: netdev})
		if !slices.Contains(port.Netdevs, netdev) {
			port.Netdevs = append(port.Netdevs, netdev)
		}
	}
	add(netip.MustParseAddr("127.0.0.1"), "lo")
	ifs, err := net.Interfaces()
	if err != nil {
		return port, fmt.Errorf("shm: list interfaces: %w", err)
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if pfx, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(pfx.IP); ok {
					add(ip.Unmap(), ifc.Name)
				}
			}
		}
	}
	return port, nil
}

// qpSocketName is the abstract Unix socket QP qpn listens on. QP numbers are unique
// among the processes of a network namespace: a QP takes its number by binding its
// socket, so requests find the process of their destination QP by its number alone.
func qpSocketName(qpn uint32) string { return fmt.Sprintf("@rsock-shm-qp-%06x", qpn) }

// track registers c to be closed by Close; it reports false, having closed c, if the
// provider is closed already.
func (p *Provider) track(c io.Closer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.closers[c] = struct{}{}
	return true
}

func (p *Provider) untrack(c io.Closer) {
	p.mu.Lock()
	delete(p.closers, c)
	p.mu.Unlock()
}

// Close stops the provider's QPs from taking requests: their sockets close, which their
// peers see as a dead link. QPs should be closed first; Close does not destroy them.
func (p *Provider) Close() error {
	p.mu.Lock()
	p.closed = true
	cs := p.closers
	p.closers = map[io.Closer]struct{}{}
	p.mu.Unlock()
	for c := range cs {
		c.Close()
	}
	p.wg.Wait()
	return nil
}

// Name returns "shm".
func (p *Provider) Name() string { return "shm" }

// Devices lists the provider's devices.
func (p *Provider) Devices() ([]verbs.DeviceAttr, error) {
	out := make([]verbs.DeviceAttr, len(p.devices))
	for i, d := range p.devices {
		out[i] = d.attrCopy()
	}
	return out, nil
}

func (d *device) attrCopy() verbs.DeviceAttr {
	a := d.attr
	a.Ports = []verbs.PortAttr{d.attr.Ports[0]}
	a.Ports[0].State = d.portState()
	a.Ports[0].GIDs = append([]verbs.GIDEntry(nil), d.attr.Ports[0].GIDs...)
	return a
}

// Open opens the named device.
func (p *Provider) Open(name string) (verbs.Context, error) {
	for _, d := range p.devices {
		if d.attr.Name == name {
			if err := p.injectedFailure(allocContext); err != nil {
				return nil, fmt.Errorf("shm: open %q: %w", name, err)
			}
			c := &Context{dev: d}
			d.ctxMu.Lock()
			d.contexts[c] = struct{}{}
			d.ctxMu.Unlock()
			return c, nil
		}
	}
	return nil, fmt.Errorf("shm: open %q: %w", name, verbs.ErrNoDevice)
}

// reserve takes one of limit slots counted by n.
func reserve(n *atomic.Int64, limit int) bool {
	if n.Add(1) > int64(limit) {
		n.Add(-1)
		return false
	}
	return true
}

// Context is an open shm device. It implements [verbs.Context].
type Context struct {
	dev    *device
	refs   rc.Refs
	events verbs.AsyncEventQueue
}

// Device returns the device's attributes.
func (c *Context) Device() verbs.DeviceAttr { return c.dev.attrCopy() }

// QueryPort returns the attributes of port num; shm devices have port 1 only.
func (c *Context) QueryPort(num uint8) (verbs.PortAttr, error) {
	if num != 1 {
		return verbs.PortAttr{}, fmt.Errorf("shm: query port %d: %w", num, verbs.ErrInvalidArgument)
	}
	return c.dev.attrCopy().Ports[0], nil
}

// WaitAsyncEvent returns the device's next asynchronous event (see [verbs.Context]).
func (c *Context) WaitAsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	e, err := c.events.Wait(ctx)
	if err != nil && errors.Is(err, verbs.ErrClosed) {
		return e, fmt.Errorf("shm: %w", err)
	}
	return e, err
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (verbs.PD, error) {
	if err := c.dev.p.injectedFailure(allocPD); err != nil {
		return nil, fmt.Errorf("shm: alloc PD: %w", err)
	}
	if err := c.refs.Acquire(); err != nil {
		return nil, fmt.Errorf("shm: alloc PD: %w", err)
	}
	return &PD{ctx: c}, nil
}

// CreateCompChannel creates a completion channel.
func (c *Context) CreateCompChannel() (verbs.CompChannel, error) {
	if err := c.dev.p.injectedFailure(allocChannel); err != nil {
		return nil, fmt.Errorf("shm: create completion channel: %w", err)
	}
	if err := c.refs.Acquire(); err != nil {
		return nil, fmt.Errorf("shm: create completion channel: %w", err)
	}
	return newCompChannel(c), nil
}

// CreateCQ creates a CQ that holds exactly cqe completions.
func (c *Context) CreateCQ(cqe int, ch verbs.CompChannel, vector int) (verbs.CQ, error) {
	if err := provider.CheckCreateCQ(&limits, cqe, vector); err != nil {
		return nil, err
	}
	var sch *CompChannel
	if ch != nil {
		var ok bool
		if sch, ok = ch.(*CompChannel); !ok || sch.ctx != c {
			return nil, fmt.Errorf("shm: create CQ: completion channel is not from this context: %w", verbs.ErrInvalidArgument)
		}
	}
	if err := c.dev.p.injectedFailure(allocCQ); err != nil {
		return nil, fmt.Errorf("shm: create CQ: %w", err)
	}
	if !reserve(&c.dev.nCQ, maxCQ) {
		return nil, fmt.Errorf("shm: create CQ: device limit of %d CQs: %w", maxCQ, verbs.ErrNoResources)
	}
	if err := c.refs.Acquire(); err != nil {
		c.dev.nCQ.Add(-1)
		return nil, fmt.Errorf("shm: create CQ: %w", err)
	}
	if sch != nil {
		if err := sch.core.Attach(); err != nil {
			c.refs.Release()
			c.dev.nCQ.Add(-1)
			return nil, fmt.Errorf("shm: create CQ: completion channel: %w", err)
		}
	}
	return newCQ(c, cqe, sch), nil
}

// Close closes the context. PDs, CQs and channels created from it must be closed first.
func (c *Context) Close() error {
	if err := c.refs.Close(); err != nil {
		return fmt.Errorf("shm: close context: %w", err)
	}
	c.dev.ctxMu.Lock()
	delete(c.dev.contexts, c)
	c.dev.ctxMu.Unlock()
	c.events.Close()
	return nil
}

// PD is a protection domain. It implements [verbs.PD]. A peer QP connected to a QP of
// this PD can map every region of the PD that grants a remote access.
type PD struct {
	ctx  *Context
	refs rc.PD // MRs and QPs; the RC core names the PD by its address
}

// Close deallocates the protection domain. Its MRs and QPs must be closed first.
func (p *PD) Close() error {
	if err := p.refs.Close(); err != nil {
		return fmt.Errorf("shm: dealloc PD: %w", err)
	}
	p.ctx.refs.Release()
	return nil
}
