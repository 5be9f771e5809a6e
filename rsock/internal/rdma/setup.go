package rdma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"sync"
	"time"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// Options size a connection's resources. Zero fields take the defaults below.
type Options struct {
	// RingSize is the receive ring's size in bytes, a power of two between MinRingSize
	// and MaxRingSize: the size the ring starts at when it grows (GrowRingTo), else its
	// size. Default 8 KiB.
	RingSize int
	// GrowRingTo, if above RingSize, lets the ring grow while a stream keeps it full,
	// by factors of four up to GrowRingTo, and shrink back to RingSize when the
	// connection idles; the staging buffer then starts at half the first ring and grows
	// up to SendBufferSize as writes need it (see "Rings that grow" in the package
	// docs). A power of two of at most MaxRingSize. Zero means DefaultGrowRingTo (or
	// a fixed ring if RingSize is at least that); negative, or equal to RingSize,
	// means a fixed ring and a staging buffer of SendBufferSize from the start. Either
	// way the ring is followed by the mailbox a growing peer announces its rings in.
	// Rings grow past 512 KiB only toward a peer whose offer names its unit ring (see
	// Offer.UnitRingSize), and to 512 KiB at most toward one that does not.
	GrowRingTo int
	// SendBufferSize is the registered staging buffer Write copies into, the most it
	// grows to when the ring grows. Default: half of GrowRingTo, at most 256 KiB (1 MiB
	// on a provider that pins memory), for a ring that grows; 64 KiB for a fixed one.
	SendBufferSize int
	// RecvWQEs is how many receive WQEs are kept posted at first. Default 64.
	RecvWQEs int
	// GrowRecvWQEsTo, if above RecvWQEs, lets the receive queue grow, doubling up to
	// GrowRecvWQEsTo (and the device's max_qp_wr), while a one-way stream of messages
	// small against the ring keeps running out of WQEs rather than ring space (see
	// "Receive queues that grow" in the package docs). A posted WQE is never taken
	// back: the queue does not shrink. Zero means DefaultGrowRecvWQEsTo when RecvWQEs
	// is zero too, else a fixed queue of RecvWQEs; negative means a fixed queue.
	GrowRecvWQEsTo int
	// SendWQEs is the send queue depth. Default 64.
	SendWQEs int
	// CQSize is the number of entries of each shared completion queue. Default 16384.
	CQSize int
	// MaxConns, if positive, caps the connections (prepared or connected) on one
	// device; Prepare fails with ErrTooManyConns beyond it.
	MaxConns int
	// PollSpin is how many empty polls a poller makes, yielding between them, before it
	// sleeps on the completion channel, and how many a waiting Read or Write makes
	// before it parks (conn_poll.go). On a CQ filled outside the process (verbs/ibv's),
	// where a spinner yields once every few polls, the spin of a Read that waits for an
	// answer counts yields (poller_yield.go). Default 64; negative means never spin.
	PollSpin int
	// ReadBufferSize is how many bytes a Conn holds in unpinned memory, beyond its ring,
	// for an application that is not reading (see "Buffering" in the package docs).
	// Default 4 MiB; negative means none: the ring alone buffers.
	ReadBufferSize int
	// Linger bounds how long Close waits for the bytes Write accepted, and the FIN
	// after them, to be acknowledged by the peer (see "Closing" in the package docs).
	// Default 5 s; negative means Close does not wait.
	Linger time.Duration
	// Budget, if not nil, is charged for the endpoint's QP and every byte it registers,
	// and refunded as they are destroyed; a refused charge fails Prepare (see Budget).
	Budget Budget
	// TrafficClass is the GRH traffic class of the QP's packets: for RoCE v2 the IP
	// header's DSCP (upper six bits) and ECN (lower two). Default 0.
	TrafficClass uint8
	// ServiceLevel is the QP's service level, 0 to 15 (RoCE: the VLAN priority the
	// device maps it to). Default 0.
	ServiceLevel uint8
	// RoCEVersion is the preferred RoCE version of the source GID where the local IP
	// has a GID of each, 1 or 2; 0 means no preference (v2). See verbs.Selector.
	RoCEVersion int
	// NoACKTimeout makes the QP wait for the peer's acknowledgements without a time
	// limit (RTS timeout 0) rather than fail with a transport retry error after about
	// half a second without one (ackTimeout tries of ackRetries). It is for providers
	// whose responder is the peer's process, not its device (verbs/shm): the scheduler
	// may hold that process back for longer under load, and the provider learns of its
	// death from its socket at once. The silence bound (conn_alive.go) still ends a
	// connection whose peer lives but completes nothing.
	NoACKTimeout bool
	// NoPlacement keeps the connection out of direct placement (place.go): the peer
	// then never writes into the application's Read buffers, and every byte is copied
	// out of the ring. Endpoints on a provider that pins memory (rdma-core) never
	// place.
	NoPlacement bool

	// netdevOf replaces the selector's interface lookup (verbs.Selector.NetdevOf) in tests.
	netdevOf func(netip.Addr) (string, error)
	// pinnedSendBuffer is the staging buffer a growing ring's default lets grow to on
	// a provider that pins memory (Conn.stageMax), set by withDefaults where it set
	// SendBufferSize; 0 where the user chose one.
	pinnedSendBuffer int
	// MaxRegisteredMemory, if positive, caps the bytes of memory the process registers
	// on one device (rings and send buffers of every connection on it, whatever their
	// Options). Prepare fails with ErrMemoryBudget beyond it. Independently of it, on a
	// provider that pins registered memory, Prepare fails with ErrMemlock before the
	// process's pinned memory would pass RLIMIT_MEMLOCK (see registerMR).
	MaxRegisteredMemory int64
}

// Budget bounds the resources of the endpoints charged to it. rsock's Listener gives the
// endpoints it prepares for unauthenticated clients one that counts per listener and per
// remote address. Charge is called before a QP is created or memory is registered, so a
// refusal allocates nothing; Refund gives back what Charge granted. Both must be safe for
// concurrent use, and Refund may come from any goroutine (the one that closes the Conn).
type Budget interface {
	// Charge asks for qps more queue pairs and bytes more bytes of registered memory.
	// Its error, if any, says which limit refuses them.
	Charge(qps, bytes int) error
	// Refund returns qps queue pairs and bytes registered bytes.
	Refund(qps, bytes int)
}

// Defaults. With them an idle connection holds a ring of 8 KiB (and its mailbox) and a
// staging buffer of 4 KiB registered, about 58 KiB per end in all; a busy stream grows
// them to a 4 MiB ring, near how far Linux's TCP autotuning takes a receive buffer by
// default (tcp_rmem's 6 MiB), and 256 KiB of staging (a staging buffer that grows
// defaults to half the largest ring, up to maxGrownSendBuffer: a 64 KiB write then takes
// one or two work requests, not five, and the writer waits for fewer completions; over
// verbs/soft that is 1.6-2x the throughput of a 128 KiB ring with 64 KiB of staging).
// A ring that grows past 512 KiB keeps a soft stream's writer blocked less often:
// 64 KiB Writes ran at 0.50x raw soft verbs with rings growing to 4 MiB against 0.33x
// with 512 KiB, 1 MiB Writes at 0.43x against 0.25x (medians of seven alternated
// rsockperf runs).
// DefaultSendBufferSize is the staging buffer of a fixed ring.
const (
	DefaultRingSize       = 8 << 10
	DefaultGrowRingTo     = 4 << 20
	DefaultSendBufferSize = 64 << 10
	DefaultRecvWQEs       = 64
	DefaultGrowRecvWQEsTo = 128
	DefaultSendWQEs       = 64
	DefaultCQSize         = 16384
	DefaultPollSpin       = 64
	DefaultReadBufferSize = 4 << 20
	DefaultLinger         = 5 * time.Second
	// maxGrownSendBuffer caps the default staging buffer of a growing ring where it
	// was before rings grew past 512 KiB: staging is pinned too, and Writes of 32 KiB
	// or more skip it where the provider allows (zcopy.go).
	maxGrownSendBuffer = 256 << 10
	// maxGrownPinnedSendBuffer caps it instead on a provider that pins (rdma-core),
	// where every Write under 1 MiB is staged (directPinMinWrite) and the staging
	// buffer is what a stream has in flight: on Soft-RoCE in the CI's VM, 64 KiB
	// Writes streamed 7-16% faster with 1 MiB than with 256 KiB (medians of four
	// boots, 16 of 22 rounds won; benchmarks/README.md, "Staging that grows to 1 MiB
	// on rdma-core"). On soft,
	// where such Writes skip staging, 1 MiB made eight net/http streams of 1 MiB
	// bodies 3-5% slower, so it stays at maxGrownSendBuffer there. A grown staging
	// buffer shrinks back when the connection idles (idleShrinkStageLocked).
	maxGrownPinnedSendBuffer = 1 << 20
	// MaxReadBufferSize bounds ReadBufferSize: 1 GiB.
	MaxReadBufferSize = 1 << 30
)

// fixedRingFrom is the RingSize from which a ring without GrowRingTo is fixed: one that
// large needs no growing.
const fixedRingFrom = 128 << 10

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.RingSize, DefaultRingSize)
	if o.GrowRingTo == 0 {
		o.GrowRingTo = DefaultGrowRingTo
		if o.RingSize >= fixedRingFrom {
			o.GrowRingTo = -1
		}
	}
	if o.GrowRingTo < 0 {
		o.GrowRingTo = -1 // a fixed ring; kept non-zero so the defaults stay put
	}
	if o.SendBufferSize == 0 && o.grows() {
		o.SendBufferSize = min(o.GrowRingTo/2, maxGrownSendBuffer) // staging grows with the ring (see the defaults)
		o.pinnedSendBuffer = min(o.GrowRingTo/2, maxGrownPinnedSendBuffer)
	}
	def(&o.SendBufferSize, DefaultSendBufferSize)
	if o.GrowRecvWQEsTo == 0 && o.RecvWQEs != 0 {
		o.GrowRecvWQEsTo = -1 // a count the user chose stays as chosen
	}
	def(&o.GrowRecvWQEsTo, DefaultGrowRecvWQEsTo)
	def(&o.RecvWQEs, DefaultRecvWQEs)
	if o.GrowRecvWQEsTo < o.RecvWQEs {
		o.GrowRecvWQEsTo = o.RecvWQEs // fixed
	}
	def(&o.SendWQEs, DefaultSendWQEs)
	def(&o.CQSize, DefaultCQSize)
	def(&o.PollSpin, DefaultPollSpin)
	def(&o.ReadBufferSize, DefaultReadBufferSize)
	if o.PollSpin < 0 {
		o.PollSpin = 0
	}
	if o.ReadBufferSize < 0 {
		o.ReadBufferSize = 0
	}
	if o.Linger == 0 {
		o.Linger = DefaultLinger
	}
	return o
}

// grows reports whether the ring (and the staging buffer) start small and grow.
func (o Options) grows() bool {
	return o.GrowRingTo > o.RingSize
}

// unitRing is the ring whose credit unit every ring of the connection has (see
// Offer.UnitRingSize): the largest it may grow to.
func (o Options) unitRing() int {
	if o.grows() {
		return o.GrowRingTo
	}
	return o.RingSize
}

// firstSendBuffer is the size the staging buffer starts at: SendBufferSize, or, when
// rings grow, half the first ring (at least 1 KiB), growing up to SendBufferSize as
// writes need it (conn_resize.go).
func (o Options) firstSendBuffer() int {
	if !o.grows() {
		return o.SendBufferSize
	}
	return min(o.SendBufferSize, max(o.RingSize/2, 1<<10))
}

// roceGIDType is the selector's form of RoCEVersion.
func (o Options) roceGIDType() verbs.GIDType {
	if o.RoCEVersion == 1 {
		return verbs.GIDTypeRoCEv1
	}
	return verbs.GIDTypeRoCEv2
}

func (o Options) validate() error {
	switch {
	case o.RingSize < MinRingSize || o.RingSize > MaxRingSize || bits.OnesCount(uint(o.RingSize)) != 1:
		return fmt.Errorf("ring size %d is not a power of two in [%d, %d]", o.RingSize, MinRingSize, MaxRingSize)
	case o.GrowRingTo > 0 && (o.GrowRingTo < o.RingSize || o.GrowRingTo > MaxRingSize || bits.OnesCount(uint(o.GrowRingTo)) != 1):
		return fmt.Errorf("largest ring %d is not a power of two in [%d, %d]", o.GrowRingTo, o.RingSize, MaxRingSize)
	case o.SendBufferSize < 1024:
		return fmt.Errorf("send buffer of %d bytes is below 1 KiB", o.SendBufferSize)
	case o.RecvWQEs < MinRecvWQEs:
		return fmt.Errorf("%d receive WQEs is below the minimum of %d", o.RecvWQEs, MinRecvWQEs)
	case o.GrowRecvWQEsTo > flowctl.MaxRecvWQEs:
		return fmt.Errorf("receive WQEs may grow to %d, above the maximum of %d", o.GrowRecvWQEsTo, flowctl.MaxRecvWQEs)
	case o.SendWQEs < 4:
		return fmt.Errorf("send queue depth %d is below 4", o.SendWQEs)
	case o.MaxRegisteredMemory < 0:
		return fmt.Errorf("negative registered-memory budget %d", o.MaxRegisteredMemory)
	case o.ReadBufferSize > MaxReadBufferSize:
		return fmt.Errorf("read buffer of %d bytes is above %d", o.ReadBufferSize, MaxReadBufferSize)
	case o.ServiceLevel > 15:
		return fmt.Errorf("service level %d is above 15", o.ServiceLevel)
	case o.RoCEVersion < 0 || o.RoCEVersion > 2:
		return fmt.Errorf("RoCE version %d is not 1 or 2 (0: no preference)", o.RoCEVersion)
	}
	return nil
}

// Offer is one side's half of an upgrade: everything the peer needs to connect its QP to
// ours and write into our ring. It travels in rsock's hello.
type Offer struct {
	GID       verbs.GID
	LID       uint16
	MTU       verbs.MTU // active MTU of our port
	QPN       uint32    // 24 bits
	PSN       uint32    // first send PSN, 24 bits
	RingAddr  uint64
	RingRKey  uint32
	RingSize  uint32
	RecvWQEs  uint32 // receive WQEs we keep posted: the peer's initial WQE credit
	MaxInline uint32
	// GrowRecvWQEsTo is the most receive WQEs we may come to keep posted (flowctl's
	// Params.GrowWQEsTo): RecvWQEs when ours do not grow. Ours is never zero; a peer's
	// is zero when its offer did not carry one (a peer from before receive queues
	// grew), and then it takes no WQE credit beyond the messages it sent, so our queue
	// does not grow toward it.
	GrowRecvWQEsTo uint32
	// UnitRingSize is the ring size whose credit unit every ring of ours has
	// (flowctl's Params.UnitRingSize): the largest we may grow to, or RingSize. Ours
	// is never zero; a peer's is zero when its offer did not carry one (a peer from
	// before rings grew past 512 KiB), and then neither side fixes a unit.
	UnitRingSize uint32
	// Place says the side can take part in direct placement (place.go): in an offer of
	// ours, that our PD registers the application's memory without pinning it and
	// Options.NoPlacement is not set (Endpoint.canPlace); in the peer's, that its hello
	// said so. Both must for a Conn to place.
	Place bool
}

// Endpoint is our side of a connection being set up: a QP in INIT with its ring
// registered and receive WQEs posted, waiting for the peer's Offer.
//
// Its QP and memory live in a protection domain of its own, pd: every registration and
// QP goes through ep.pd (registerCounted, never a PD of the device), so that the peer
// of this QP can reach this endpoint's ring and nothing else (see "Isolation" in the package docs).
type Endpoint struct {
	opts     Options
	dev      *device
	pd       verbs.PD // this endpoint's own protection domain
	path     portPath // port and source GID, chosen by the bootstrap connection's local IP
	poller   *poller
	entries  int      // CQ entries reserved on poller
	recvCap  int      // receive WQEs the QP has room for, besides the proof WQE: the most RecvWQEs may grow to
	ring     verbs.MR // the ring data lands in, with the mailbox after it (see mailboxSize)
	oldRing  verbs.MR // the ring a switch replaced, while it holds bytes (conn_resize.go)
	nextRing verbs.MR // the ring announced to the peer, until its switch arrives
	sendBuf  verbs.MR
	oldSend  verbs.MR // the staging buffer a larger one replaced, while sends from it are in flight
	qp       verbs.QP
	psn      uint32
	inline   int
	admitted bool // counted in dev.conns
	// dirty says a region other than the endpoint's own may still be registered in pd
	// (a direct write's buffer that failed to deregister): its shell is not pooled.
	dirty bool

	// What is charged to opts.Budget: queue pairs and registered bytes.
	qpCharge, memCharge int
	gen                 uint64 // generation in every WR ID (conn_flow.go)

	// The proof WQE's SGE, here rather than in a slice of its own: the endpoint is on
	// the heap anyway, and a dial allocates less. A provider may keep the SGL it was
	// posted with until the WQE completes.
	setupSGE [1]verbs.SGE
	// The records of the first ring and send buffer (registerMRIn), for the same
	// reason.
	firstRing, firstSend countedMR
	// The Conn's staging cursors (Conn.stageEnd), for the default send queue depth
	// or less, for the same reason.
	stageEnd [DefaultSendWQEs]uint64
	// The Conn that Connect makes, which owns the endpoint from then on, for the same
	// reason: the two live and die together.
	conn Conn
}

// Prepare is PrepareContext with a background context.
func Prepare(p verbs.Provider, ip netip.Addr, opts Options) (*Endpoint, error) {
	return PrepareContext(context.Background(), p, ip, opts)
}

// PrepareContext creates our side of an RDMA connection on provider p for a bootstrap
// connection whose local address is ip: the port and source GID are the ones that
// serve ip. On error nothing is left allocated.
//
// ctx bounds the steps that can take long: listing the provider's devices and opening
// the device (see acquireDevice). When ctx ends first, PrepareContext returns an error
// matching ctx.Err(). The verbs calls that follow (CQ, PD, MRs, QP) are single system
// calls; ctx is checked once more after them.
func PrepareContext(ctx context.Context, p verbs.Provider, ip netip.Addr, opts Options) (_ *Endpoint, err error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ep := &Endpoint{opts: opts, gen: newGen()}
	if err := ep.charge(1, 0); err != nil {
		return nil, fmt.Errorf("queue pair: %w", err)
	}
	defer func() {
		if err != nil {
			ep.release()
		}
	}()
	dev, path, err := acquireDevice(ctx, p, ip, verbs.Selector{RoCEVersion: opts.roceGIDType(), NetdevOf: opts.netdevOf})
	if err != nil {
		return nil, err
	}
	ep.dev, ep.path = dev, path
	if err := checkCaps(dev.attr, opts); err != nil { // caps.go
		return nil, err
	}
	if !dev.admit(opts.MaxConns) {
		return nil, fmt.Errorf("%w: %d on %s", ErrTooManyConns, opts.MaxConns, dev.attr.Name)
	}
	// One more receive WQE than opts.RecvWQEs: the proof WQE (conn_proof.go).
	ep.admitted, ep.entries = true, opts.SendWQEs+opts.RecvWQEs+1
	if ep.poller, err = dev.pollerFor(ep.entries, opts.CQSize, opts.PollSpin); err != nil {
		ep.entries = 0
		return nil, err
	}
	if err = ep.prepareMemory(); err != nil {
		return nil, err
	}
	ep.inline = min(dev.attr.MaxInline, maxInline)
	ep.recvCap = recvCap(dev.attr, opts)
	ep.qp, err = ep.pd.CreateQP(verbs.QPInitAttr{
		SendCQ: ep.poller.qpCQ,
		RecvCQ: ep.poller.qpCQ,
		Caps: verbs.QPCaps{
			MaxSendWR: opts.SendWQEs, MaxRecvWR: ep.recvCap + 1,
			MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: ep.inline,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create QP: %w", err)
	}
	if err = ep.qp.ToInit(verbs.InitAttr{Port: path.port.Num, Access: verbs.AccessRemoteWrite}); err != nil {
		return nil, fmt.Errorf("QP to INIT: %w", err)
	}
	// The proof WQE first: the peer's first message lands in it (conn_proof.go).
	ep.setupSGE[0] = verbs.SGE{Addr: ep.ring.Addr() + uint64(opts.RingSize) + mailboxProof, Length: ProofMaxLen, LKey: ep.ring.LKey()}
	if err = ep.postSetupRecvs(); err != nil {
		return nil, err
	}
	var b [4]byte
	rand.Read(b[:])
	ep.psn = binary.LittleEndian.Uint32(b[:]) & 0xffffff
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return ep, nil
}

// setupBatch is how many receive WQEs PrepareContext posts in one call: one post (a
// lock on soft, a cgo call and the provider's lock on ibv) for each batch rather than
// for each WQE.
const setupBatch = 16

// setupBatches holds the arrays the batches are built in: a provider copies the WRs
// it is given, so an array serves one post call at a time, and neither each endpoint
// nor each dial keeps one of its own.
var setupBatches = sync.Pool{New: func() any { return new([setupBatch]verbs.RecvWR) }}

// postSetupRecvs posts the endpoint's receive WQEs: the proof WQE first, whose SGE
// points into the mailbox (the peer's first message lands in it: conn_proof.go), then
// opts.RecvWQEs without SGEs (writes with immediate land in the ring), numbered from 0.
func (ep *Endpoint) postSetupRecvs() error {
	recv := setupBatches.Get().(*[setupBatch]verbs.RecvWR)
	defer func() {
		clear(recv[:]) // the proof WQE's SGL points into the endpoint
		setupBatches.Put(recv)
	}()
	first := -1 // the WQE in recv[0]; -1 is the proof WQE
	n := 0
	for i := -1; i < ep.opts.RecvWQEs; i++ {
		if i < 0 {
			recv[n] = verbs.RecvWR{ID: recvWRFlag | ep.gen | proofRecvIndex, SGL: ep.setupSGE[:]}
		} else {
			recv[n] = verbs.RecvWR{ID: recvWRFlag | ep.gen | uint64(i)}
		}
		n++
		if n < len(recv) && i < ep.opts.RecvWQEs-1 {
			continue
		}
		if err := ep.qp.PostRecv(recv[:n]); err != nil {
			var pe *verbs.PostError
			switch {
			case !errors.As(err, &pe):
				return fmt.Errorf("post receive WQEs: %w", err)
			case first+pe.Index < 0:
				return fmt.Errorf("post the proof WQE: %w", err)
			}
			return fmt.Errorf("post receive WQE %d: %w", first+pe.Index, err)
		}
		first, n = i+1, 0
	}
	return nil
}

// prepareMemory gives the endpoint its protection domain, first ring (with the mailbox)
// and first staging buffer: a pooled shell's (pool.go), or new ones.
func (ep *Endpoint) prepareMemory() (err error) {
	if ok, err := ep.takeShell(); ok || err != nil {
		return err
	}
	dev, opts := ep.dev, ep.opts
	if ep.pd, err = dev.ctx.AllocPD(); err != nil {
		return fmt.Errorf("allocate protection domain on %s: %w", dev.attr.Name, err)
	}
	if ep.ring, err = ep.registerMRIn(&ep.firstRing, opts.RingSize+mailboxSize, ringAccess, "receive ring"); err != nil {
		return err
	}
	if ep.sendBuf, err = ep.registerMRIn(&ep.firstSend, opts.firstSendBuffer(), verbs.AccessLocalWrite, "send buffer"); err != nil {
		return err
	}
	return nil
}

// Offer returns what the peer needs to connect to this endpoint.
func (ep *Endpoint) Offer() Offer {
	return Offer{
		GID:            ep.path.gid.GID,
		LID:            ep.path.port.LID,
		MTU:            ep.path.port.ActiveMTU,
		QPN:            ep.qp.QPN(),
		PSN:            ep.psn,
		RingAddr:       ep.ring.Addr(),
		RingRKey:       ep.ring.RKey(),
		RingSize:       uint32(ep.opts.RingSize),
		RecvWQEs:       uint32(ep.opts.RecvWQEs),
		MaxInline:      uint32(ep.inline),
		GrowRecvWQEsTo: uint32(ep.recvCap),
		UnitRingSize:   uint32(ep.opts.unitRing()),
		Place:          ep.canPlace(),
	}
}

// Abort releases an endpoint that will not be connected.
func (ep *Endpoint) Abort() error { return ep.release() }

// connectQP brings the QP to RTS against the peer's offer.
func (ep *Endpoint) connectQP(peer Offer) error {
	if err := peer.validate(); err != nil {
		return err
	}
	mtu := min(ep.path.port.ActiveMTU, peer.MTU)
	if mtu.Bytes() == 0 {
		return fmt.Errorf("%w: ours %v, peer's %v", ErrMTU, ep.path.port.ActiveMTU, peer.MTU)
	}
	err := ep.qp.ToRTR(verbs.RTRAttr{
		PathMTU: mtu,
		DestQPN: peer.QPN,
		RQPSN:   peer.PSN,
		Dest: verbs.AddressVector{
			LID: peer.LID, Port: ep.path.port.Num, IsGlobal: true,
			// The hardware index (the selector never picks one above 255).
			DestGID: peer.GID, SGIDIndex: uint8(ep.path.gid.Index), HopLimit: 64,
			TrafficClass: ep.opts.TrafficClass, SL: ep.opts.ServiceLevel,
		},
		MinRNRTimer: 12, // 0.64 ms; flow control keeps RNR from happening at all
	})
	if err != nil {
		return fmt.Errorf("QP to RTR: %w", err)
	}
	err = ep.qp.ToRTS(verbs.RTSAttr{
		SQPSN:      ep.psn,
		Timeout:    ep.ackTimeout(),
		RetryCount: ackRetries,
		RNRRetry:   7,
	})
	if err != nil {
		return fmt.Errorf("QP to RTS: %w", err)
	}
	return nil
}

// The QP's acknowledgement timeout, encoded as the RTS attribute (4.096 µs × 2^14 ≈ 67
// ms per try), and its retries: a path dead for about half a second fails the QP.
const (
	ackTimeout = 14
	ackRetries = 7
)

// ackTimeout is the RTS timeout the endpoint's QP uses: ackTimeout, or 0 (none) with
// Options.NoACKTimeout.
func (ep *Endpoint) ackTimeout() uint8 {
	if ep.opts.NoACKTimeout {
		return 0
	}
	return ackTimeout
}

// charge asks the budget, if any, for qps queue pairs and bytes registered bytes. What
// it grants is recorded even without a budget, for AdoptBudget.
func (ep *Endpoint) charge(qps, bytes int) error {
	if ep.opts.Budget != nil {
		if err := ep.opts.Budget.Charge(qps, bytes); err != nil {
			return err
		}
	}
	ep.qpCharge += qps
	ep.memCharge += bytes
	return nil
}

// refund returns what charge took.
func (ep *Endpoint) refund(qps, bytes int) {
	ep.qpCharge -= qps
	ep.memCharge -= bytes
	if ep.opts.Budget != nil {
		ep.opts.Budget.Refund(qps, bytes)
	}
}

// AdoptBudget charges b for the queue pair and the registered memory the endpoint
// holds, and makes b the budget of what it charges and refunds from then on, as if it
// had been prepared with Options.Budget b: for an endpoint prepared ahead, before the
// client it serves was known (rsock's Listener keeps one). The endpoint must have been
// prepared without a budget and not be connected yet. A nil b bounds nothing; a refused
// charge leaves the endpoint as it was.
func (ep *Endpoint) AdoptBudget(b Budget) error {
	if ep.opts.Budget != nil {
		return errors.New("rdma: adopt a budget: the endpoint has one")
	}
	if b == nil {
		return nil
	}
	if err := b.Charge(ep.qpCharge, ep.memCharge); err != nil {
		return err
	}
	ep.opts.Budget = b
	return nil
}

// closeQP destroys the endpoint's QP, if it still has one. A QP that fails to be
// destroyed may be left in the PD: its shell is not pooled.
func (ep *Endpoint) closeQP() error {
	if ep.qp == nil {
		return nil
	}
	err := ep.qp.Close()
	if err != nil {
		ep.dirty = true // a QP may be left in the PD
	}
	ep.qp = nil
	return err
}

// release frees whatever the endpoint holds, in reverse order of creation, and refunds
// its budget.
func (ep *Endpoint) release() error {
	var errs []error
	add := func(err error) { // only failures: a release that succeeds allocates nothing for them
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(ep.closeQP())
	ep.poolShell() // pool.go: else the loops below free the regions and the PD
	for _, mr := range [...]*verbs.MR{&ep.sendBuf, &ep.oldSend, &ep.ring, &ep.oldRing, &ep.nextRing} {
		if *mr != nil {
			add((*mr).Close())
			*mr = nil
		}
	}
	if ep.pd != nil {
		add(ep.pd.Close())
		ep.pd = nil
	}
	ep.refund(ep.qpCharge, ep.memCharge) // the QP, and anything not refunded above
	if ep.poller != nil {
		ep.poller.unreserve(ep.entries)
		ep.poller = nil
	}
	if ep.dev != nil {
		if ep.admitted {
			ep.dev.leave()
			ep.admitted = false
		}
		add(ep.dev.release())
		ep.dev = nil
	}
	return errors.Join(errs...)
}

func (o Offer) validate() error {
	switch {
	case o.QPN == 0 || o.QPN > 0xffffff:
		return fmt.Errorf("%w: QPN %#x", ErrBadOffer, o.QPN)
	case o.PSN > 0xffffff:
		return fmt.Errorf("%w: PSN %#x", ErrBadOffer, o.PSN)
	case o.RingSize < MinRingSize || o.RingSize > MaxRingSize || bits.OnesCount32(o.RingSize) != 1:
		return fmt.Errorf("%w: ring size %d", ErrBadOffer, o.RingSize)
	case o.RecvWQEs < MinRecvWQEs:
		return fmt.Errorf("%w: %d receive WQEs", ErrBadOffer, o.RecvWQEs)
	case o.GrowRecvWQEsTo != 0 && (o.GrowRecvWQEsTo < o.RecvWQEs || o.GrowRecvWQEsTo > flowctl.MaxRecvWQEs):
		return fmt.Errorf("%w: receive WQEs grow from %d to %d", ErrBadOffer, o.RecvWQEs, o.GrowRecvWQEsTo)
	}
	return nil
}
