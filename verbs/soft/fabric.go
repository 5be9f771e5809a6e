package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// Default device limits, used for every zero field of [Limits].
const (
	DefaultMaxQP     = 1 << 16
	DefaultMaxQPWR   = 16384
	DefaultMaxSGE    = 30
	DefaultMaxCQ     = 1 << 16
	DefaultMaxCQE    = 1<<22 - 1
	DefaultMaxMR     = 1 << 16
	DefaultMaxMRSize = 1 << 34
	DefaultMaxInline = 256

	// maxMRLimit bounds Limits.MaxMR: the key table has room for this many regions.
	maxMRLimit = rc.MaxKeyIndexes
)

// Limits are the capacities every device of a [Fabric] reports in its [verbs.DeviceAttr]
// and enforces. Zero fields take the Default values; set small ones to make resource
// exhaustion easy to reach in tests.
type Limits struct {
	MaxQP     int    // live QPs per device
	MaxQPWR   int    // MaxSendWR and MaxRecvWR a QP may be created with
	MaxSGE    int    // MaxSendSGE and MaxRecvSGE a QP may be created with
	MaxCQ     int    // live CQs per device
	MaxCQE    int    // entries of one CQ
	MaxMR     int    // live MRs per device (at most about 2^20)
	MaxMRSize uint64 // largest region RegMR accepts
	MaxInline int    // largest MaxInlineData a QP may be created with
}

// Options configure a [Fabric]. The zero value gives one device, default limits and timers
// that run in real time.
type Options struct {
	// Devices is how many devices the fabric has, named soft0, soft1, ... Values below 1
	// mean 1; values above 254 mean 254. Device i has the RoCE v2 GID of the loopback
	// address 127.0.0.(i+1), so a test that dials 127.0.0.1 finds soft0 by its address.
	Devices int
	// Ports configures the port of device i with Ports[i] (GID table with holes,
	// netdevs, link layer, state: see [PortConfig]); devices beyond it take the
	// default port. An invalid configuration fails Devices and Open.
	Ports []PortConfig
	// Limits are the device limits.
	Limits Limits
	// TimeScale multiplies every transport timer: the local ACK timeout after which a
	// lost request is retransmitted and the RNR NAK delay. 0 means 1 (real time); tests
	// use small values such as 0.01 so that a retry budget runs out quickly. Scaled
	// timers are never shorter than 1 µs.
	TimeScale float64
}

// Fabric is a set of software RDMA devices in one process, connected by a lossless
// in-process network. It implements [verbs.Provider]; its fault-injection methods break,
// delay and fail parts of it, and [Fabric.Stats] counts live resources and traffic.
type Fabric struct {
	limits  Limits
	scale   float64
	devices []*device
	byName  map[string]*device
	byGID   map[verbs.GID]*device // immutable after New: read without locks

	nextAddr atomic.Uint64 // synthetic MR addresses, unique in the fabric

	allocFail [numAllocKinds]atomic.Int64 // remaining injected allocation failures

	// faultsUsed is set, and never cleared, by the first fault injected on the fabric.
	// Until then the data path skips every fault check.
	faultsUsed atomic.Bool
	linkMu     sync.RWMutex
	links      map[[2]int]linkFault // by ordered device index pair
	paths      pathTable            // path.go

	tap atomic.Pointer[func(TapEvent)] // see SetTap

	live struct {
		contexts, pds, mrs, cqs, qps, channels atomic.Int64
	}

	configErr error         // an invalid Options.Ports, returned by Devices and Open
	teardown  teardownModel // teardown.go
}

// The soft types implement the verbs interfaces.
var (
	_ verbs.Provider    = (*Fabric)(nil)
	_ verbs.Context     = (*Context)(nil)
	_ verbs.PD          = (*PD)(nil)
	_ verbs.MR          = (*MR)(nil)
	_ verbs.CQ          = (*CQ)(nil)
	_ verbs.CompChannel = (*CompChannel)(nil)
	_ verbs.QP          = (*QP)(nil)
)

// device is one software device: its attributes, key tables and counters.
type device struct {
	fab   *Fabric
	index int
	attr  verbs.DeviceAttr // immutable; Ports[0].GIDs lists the GIDs that reach it

	mrs rc.KeyTable

	qpMu    sync.RWMutex
	qps     map[uint32]*QP
	nextQPN uint32

	nQP, nCQ, nMR atomic.Int64 // live counts checked against the limits

	stats devStats

	events eventHub // async events: contexts to tell, port states (events.go)
}

// devStats are a device's traffic counters; see [Stats].
type devStats struct {
	wrs, bytes, rnrNAKs, retries, errors, flushed atomic.Uint64
}

// New returns a fabric with the devices opts describes.
func New(opts Options) *Fabric {
	n := min(max(opts.Devices, 1), 254)
	f := &Fabric{
		limits: opts.Limits.withDefaults(),
		scale:  opts.TimeScale,
		byName: make(map[string]*device, n),
		byGID:  make(map[verbs.GID]*device, 2*n),
		links:  make(map[[2]int]linkFault),
	}
	if f.scale <= 0 {
		f.scale = 1
	}
	f.nextAddr.Store(1 << 32)
	for i := range n {
		d := &device{fab: f, index: i, qps: make(map[uint32]*QP), nextQPN: 0x100}
		guid := uint64(0x02005eff_fe000000) | uint64(i+1)
		port, err := portAttr(opts, i, guid) // gid.go
		if err != nil && f.configErr == nil {
			f.configErr = err
		}
		d.attr = verbs.DeviceAttr{
			Name:      fmt.Sprintf("soft%d", i),
			NodeGUID:  guid,
			MaxQP:     f.limits.MaxQP,
			MaxQPWR:   f.limits.MaxQPWR,
			MaxSGE:    f.limits.MaxSGE,
			MaxCQ:     f.limits.MaxCQ,
			MaxCQE:    f.limits.MaxCQE,
			MaxMR:     f.limits.MaxMR,
			MaxMRSize: f.limits.MaxMRSize,
			MaxInline: f.limits.MaxInline,
			Ports:     []verbs.PortAttr{port},
		}
		f.devices = append(f.devices, d)
		f.byName[d.attr.Name] = d
		for _, g := range port.GIDs {
			if f.byGID[g.GID] == nil { // a GID on two devices: the first one holds it
				f.byGID[g.GID] = d
			}
		}
	}
	return f
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxQP, DefaultMaxQP)
	def(&l.MaxQPWR, DefaultMaxQPWR)
	def(&l.MaxSGE, DefaultMaxSGE)
	def(&l.MaxCQ, DefaultMaxCQ)
	def(&l.MaxCQE, DefaultMaxCQE)
	def(&l.MaxMR, DefaultMaxMR)
	def(&l.MaxInline, DefaultMaxInline)
	if l.MaxMR > maxMRLimit {
		l.MaxMR = maxMRLimit
	}
	if l.MaxMRSize == 0 {
		l.MaxMRSize = DefaultMaxMRSize
	}
	return l
}

// Name returns "soft".
func (f *Fabric) Name() string { return "soft" }

// IsolatesRegionsByQP reports that a peer reaches a registered region only through a
// QP of the region's PD, connected to the peer's: a region whose PD holds no QP is
// out of every peer's reach. rsock's engine reuses such regions for later connections.
func (f *Fabric) IsolatesRegionsByQP() bool { return true }

// Devices lists the fabric's devices. The slices returned are copies.
func (f *Fabric) Devices() ([]verbs.DeviceAttr, error) {
	if f.configErr != nil {
		return nil, f.configErr
	}
	out := make([]verbs.DeviceAttr, len(f.devices))
	for i, d := range f.devices {
		out[i] = d.attrCopy()
	}
	return out, nil
}

// Open opens the named device. Each call returns a new, independent context.
func (f *Fabric) Open(name string) (verbs.Context, error) {
	if f.configErr != nil {
		return nil, f.configErr
	}
	d, ok := f.byName[name]
	if !ok {
		return nil, fmt.Errorf("soft: open %q: %w", name, verbs.ErrNoDevice)
	}
	if err := f.injectedFailure(AllocContext); err != nil {
		return nil, fmt.Errorf("soft: open %q: %w", name, err)
	}
	f.live.contexts.Add(1)
	c := &Context{dev: d}
	d.events.add(c)
	return c, nil
}

func (d *device) attrCopy() verbs.DeviceAttr {
	a := d.attr
	a.NumCompVectors = compVectors
	a.Ports = make([]verbs.PortAttr, len(d.attr.Ports))
	for i, p := range d.attr.Ports {
		p.GIDs = append([]verbs.GIDEntry(nil), p.GIDs...)
		p.Netdevs = append([]string(nil), p.Netdevs...)
		p.State = d.events.portState(p.Num, p.State)
		a.Ports[i] = p
	}
	return a
}

// reserve increments n if it stays within limit, reporting whether it did.
func reserve(n *atomic.Int64, limit int) bool {
	for {
		v := n.Load()
		if v >= int64(limit) {
			return false
		}
		if n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// qp returns the live QP numbered qpn on d, or nil.
func (d *device) qp(qpn uint32) *QP {
	d.qpMu.RLock()
	q := d.qps[qpn]
	d.qpMu.RUnlock()
	return q
}

// addQP gives q a QP number that no live QP of d has and registers it.
func (d *device) addQP(q *QP) {
	d.qpMu.Lock()
	if d.fab.teardown.reuseQPNs.Load() {
		d.nextQPN = 0x100 // lowest free first
	}
	for {
		n := d.nextQPN & 0xffffff
		d.nextQPN = n + 1
		if n < 0x100 { // low numbers are special QPs on real devices
			continue
		}
		if _, used := d.qps[n]; !used {
			q.qpn = n
			d.qps[n] = q
			break
		}
	}
	d.qpMu.Unlock()
}

func (d *device) removeQP(q *QP) {
	d.qpMu.Lock()
	if d.qps[q.qpn] == q {
		delete(d.qps, q.qpn)
	}
	d.qpMu.Unlock()
}

// Stats are live resource counts and traffic counters of a [Fabric], for tests that check
// that nothing leaks and that no unexpected RNR or retry happened.
type Stats struct {
	Contexts, PDs, MRs, CQs, QPs, CompChannels int // live resources

	WRs     uint64 // send work requests the responder executed successfully
	Bytes   uint64 // payload bytes those work requests moved
	RNRNAKs uint64 // receiver-not-ready NAKs responders returned
	Retries uint64 // transport retransmissions after a lost request (broken link, dead peer)
	Errors  uint64 // completions with an error status other than WR_FLUSH_ERR
	Flushed uint64 // completions with WR_FLUSH_ERR
}

// Stats returns the fabric's live resource counts and traffic counters.
func (f *Fabric) Stats() Stats {
	s := Stats{
		Contexts:     int(f.live.contexts.Load()),
		PDs:          int(f.live.pds.Load()),
		MRs:          int(f.live.mrs.Load()),
		CQs:          int(f.live.cqs.Load()),
		QPs:          int(f.live.qps.Load()),
		CompChannels: int(f.live.channels.Load()),
	}
	for _, d := range f.devices {
		s.WRs += d.stats.wrs.Load()
		s.Bytes += d.stats.bytes.Load()
		s.RNRNAKs += d.stats.rnrNAKs.Load()
		s.Retries += d.stats.retries.Load()
		s.Errors += d.stats.errors.Load()
		s.Flushed += d.stats.flushed.Load()
	}
	return s
}
