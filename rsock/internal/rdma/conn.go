package rdma

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// Conn is a byte stream over one RC queue pair. Its methods are safe for concurrent use,
// with the semantics of net.Conn; addresses are the bootstrap connection's, and the
// caller (rsock.Conn) provides them.
//
// Locking: rmu serializes readers and wmu writers; each is held across the whole call,
// including waits, so that concurrent Reads or Writes do not interleave. mu guards the
// flow-control state, the send queue and staging accounting, the spill buffer, and
// posting (flowctl requires messages to be posted in the order it hands them out); it
// is never held across a wait. Copies out of the ring and the spill buffer happen
// outside mu: while a Read is in progress (reading), nothing spills, and the bytes stay
// put until the Read consumes them. Spilling copies into the spill buffer with mu held,
// on the poller's goroutine or at the end of a Read.
type Conn struct {
	ep   *Endpoint
	qp   queuePair
	ctrl net.Conn // bootstrap connection: liveness and close notification
	gen  uint64   // the endpoint's generation, in every WR ID (conn_flow.go)
	poll *poller  // the endpoint's poller, which waiting Reads and Writes poll (conn_poll.go)

	stale atomic.Uint64 // completions of a destroyed QP of the same number, dropped
	wrote atomic.Bool   // a Write began since the last Read did (awaitsAnswer, conn_poll.go)
	// readChanges counts the events that may change what a Read's look (unread) finds:
	// arrivals, failure, Close. Added to under mu; a spinning Read reads it without
	// (spin.quiet).
	readChanges atomic.Uint32

	rmu, wmu sync.Mutex

	mu  sync.Mutex
	fc  flowctl.Endpoint
	err error // sticky failure: QP or CQ error, protocol violation, control loss

	// Peer ring, as the offer described it.
	peerRingAddr uint64
	peerRKey     uint32

	// Send queue accounting. WR IDs of sends are their sequence numbers.
	sqDepth     uint64
	sqPosted    uint64 // send WRs posted
	sqDone      uint64 // send WRs retired by signaled completions
	sinceSignal uint64 // unsignaled WRs posted since the last signaled one
	signalTail  uint64 // staging cursor after the last signaled WR
	signalEvery uint64
	stageEnd    []uint64 // staging cursor after WR i, at stageEnd[i % sqDepth]
	stage       []byte   // registered send staging buffer
	stageKey    uint32
	stageAddr   uint64
	stageTail   uint64 // bytes of staging handed out (monotonic)
	stageHead   uint64 // bytes of staging released by completions
	wrs         [2]verbs.SendWR
	wrEnd       [2]uint64 // staging cursor after each of wrs: completing it frees up to there
	sges        [2][1]verbs.SGE
	inline      int
	maxChunk    int
	writeClosed bool // CloseWrite was called
	finPosted   bool // the FIN has been posted, as send WR finID
	finID       uint64
	peerGone    bool // the control connection closed
	closing     bool // Close was called
	recvWR      [1]verbs.RecvWR
	ring        []byte // the ring data lands in (without its mailbox)

	// Rings that grow (conn_resize.go).
	oldRing        []byte // the ring the last switch replaced, while it holds bytes
	growTo         int    // largest ring to grow to; 0: no growth (any more)
	growErr        error  // why growth stopped, if it did
	nextRingSize   int    // size of the ring announced, until the switch
	peerNextAddr   uint64 // the peer's announced ring, written from our switch on
	peerNextRKey   uint32 //
	ringSwitches   uint64 // our ring was replaced this many times
	stageMax       int    // largest staging buffer to grow to
	oldStageUntil  uint64 // sends below this WR id use ep.oldSend
	stagedAtTick   uint64 // stageTail at the last keepalive tick (idleShrinkStageLocked)
	turnover       uint64 // bytes that arrived since the ring became current
	dataArrivals   uint64 // data messages that arrived
	arrivalsAtTick uint64 // dataArrivals at the last keepalive tick

	// Receive queues that grow (conn_wqes.go).
	wqeGrowTo int // most receive WQEs to grow to; at or below fc.WQEs(): no growth (any more)
	wqeBound  int // arrivals since the last growth that found WQEs, not the ring, bounding the stream

	// Receive buffering beyond the ring (conn_spill.go, "Buffering" in doc.go).
	spill       spillBuf
	spillMax    int    // most bytes spill may hold
	reading     bool   // a Read or WriteTo is in progress: nothing may spill
	stageLent   bool   // a ReadFrom reads into staging outside mu (conn_send.go)
	releaseLeft bool   // Close tore down during a Read or such a ReadFrom, which releases the endpoint (teardown)
	spilled     uint64 // bytes ever moved out of the ring into spill
	linger      time.Duration

	// Signals to a parked waiter, each made under mu by the first waiter that parks on
	// it (most connections never wait long enough to park), before the look that
	// precedes its park: a signal before that finds nil and is dropped, but what it
	// signals is seen by that look. Signalled only under mu.
	readable chan struct{} // cap 1: data, FIN, failure or Close arrived
	writable chan struct{} // cap 1: credit, staging or SQ space arrived, or failure or Close
	drained  chan struct{} // cap 1: a send completion arrived (Close waits for the drain)
	rdl, wdl deadline

	// A Read or Write is parked on readable or writable: completions signal them only
	// then (conn_poll.go). Guarded by mu.
	readParked, writeParked bool

	closeOnce sync.Once
	startOnce sync.Once
	closeErr  error
	// The control reader runs (readerRunning) until it returns; a Close that finds it
	// running leaves the control channel's close to it (readerFinishes: see close).
	// Guarded by mu.
	readerRunning, readerFinishes bool
	ctrlBuf                       [16]byte // the control reader's buffer (conn_close.go)
	peek                          ctrlPeek // Close's look at the control socket (conn_ctrlpeek.go)
	kaPeriod                      time.Duration
	// The control reader keeps the keepalive periods (readControl): kaSending is set
	// while a period's keepalive is being sent, and kaOff once one failed to go out,
	// after which none follows. Guarded by mu.
	kaSending, kaOff bool

	// Silence (conn_alive.go), guarded by mu: completions seen, the count at the last
	// keepalive period, and the periods in a row that saw none.
	heard, heardMark uint64
	silentPeriods    int
	graceTimer       *time.Timer
	started          bool       // Start was called: the control channel is the Conn's
	proof            proofState // the peer's proof (conn_proof.go)
	proofSlot        []byte     // where the proof WQE takes it: ProofMaxLen bytes of the mailbox

	stats connStats // counters and tracing hooks (stats.go)

	direct directWriter // large Writes posted from the caller's buffer (zcopy.go), guarded by mu
	place  placement    // large Reads the peer writes into directly (place.go), guarded by mu
	// qpErrored: failLocked moved the QP to ERROR. Guarded by mu.
	qpErrored bool
}

// queuePair is what a Conn needs of its QP once connected: posting, its number, and
// moving it to ERROR. A verbs.QP is one; the send and receive paths' tests drive a
// Conn with a fake (conn_fake_test.go), without a provider.
type queuePair interface {
	PostSend(wrs []verbs.SendWR) error
	PostRecv(wrs []verbs.RecvWR) error
	QPN() uint32
	ToError() error
}

// Connect brings the endpoint's QP to RTS against the peer's offer and returns the
// stream, already receiving. ctrl is the bootstrap connection, which the Conn keeps as
// its control channel and closes with itself; Connect does not touch it, so the caller
// may finish its handshake on it before calling [Conn.Start]. keepalive, if positive,
// is the period of control-channel keepalives; three missed periods close the Conn with
// ErrKeepaliveTimeout. On error the endpoint is still the caller's to Abort; after
// success it belongs to the Conn.
func (ep *Endpoint) Connect(peer Offer, ctrl net.Conn, keepalive time.Duration) (*Conn, error) {
	local := flowctl.Params{RingSize: ep.opts.RingSize, RecvWQEs: ep.opts.RecvWQEs}
	growTo := 0
	if ep.opts.grows() {
		growTo = ep.opts.GrowRingTo
	}
	if peer.UnitRingSize != 0 {
		local.UnitRingSize = ep.opts.unitRing() // as our Offer said
	} else {
		// The peer takes every ring's credit unit from its size: rings up to
		// legacyUnitRing share the 1-byte unit, and no larger ring shares its unit with
		// another, so a ring that starts there or above does not grow (below).
		growTo = min(growTo, legacyUnitRing)
	}
	if peer.GrowRecvWQEsTo != 0 {
		// The peer takes credit for the WQEs we add: we may grow toward it.
		local.GrowWQEsTo = ep.recvCap // as our Offer said
	}
	fc, err := flowctl.MakeEndpoint(local, flowctl.Params{
		RingSize: int(peer.RingSize), RecvWQEs: int(peer.RecvWQEs), UnitRingSize: int(peer.UnitRingSize),
		GrowWQEsTo: int(peer.GrowRecvWQEsTo),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadOffer, err)
	}
	if err := ep.connectQP(peer); err != nil {
		return nil, err
	}
	depth := uint64(ep.opts.SendWQEs)
	stageEnd := ep.stageEnd[:]
	if depth <= uint64(len(stageEnd)) {
		stageEnd = stageEnd[:depth] // in the Endpoint, which the Conn keeps
	} else {
		stageEnd = make([]uint64, depth)
	}
	c := &ep.conn // in the Endpoint, which the Conn keeps
	*c = Conn{
		ep:           ep,
		qp:           ep.qp,
		gen:          ep.gen,
		poll:         ep.poller,
		ctrl:         ctrl,
		fc:           fc,
		peerRingAddr: peer.RingAddr,
		peerRKey:     peer.RingRKey,
		sqDepth:      depth,
		signalEvery:  max(depth/4, 1),
		stageEnd:     stageEnd,
		stage:        ep.sendBuf.Bytes(),
		stageKey:     ep.sendBuf.LKey(),
		stageAddr:    ep.sendBuf.Addr(),
		inline:       ep.inline, // the sender's QP decides what goes inline
		maxChunk:     max(ep.opts.firstSendBuffer()/4, 1),
		stageMax:     ep.stageMax(),
		ring:         ep.ring.Bytes()[:ep.opts.RingSize],
		spillMax:     ep.opts.ReadBufferSize,
		linger:       ep.opts.Linger,
		kaPeriod:     keepalive,
		proofSlot:    ep.ring.Bytes()[ep.opts.RingSize+mailboxProof:][:ProofMaxLen],
	}
	if growTo > ep.opts.RingSize {
		c.growTo = growTo
	}
	if local.GrowWQEsTo > ep.opts.RecvWQEs {
		c.wqeGrowTo = local.GrowWQEsTo
	}
	if peer.Place && ep.canPlace() {
		c.place.reg = placeRegistrar(ep.pd)
	}
	if err := ep.poller.attach(c.qp.QPN(), c); err != nil {
		return nil, err
	}
	return c, nil
}

// Start hands the control channel to the Conn once the handshake on it is over: from
// now on its end, or its silence past the keepalive timeout, ends the Conn.
func (c *Conn) Start() {
	c.startOnce.Do(func() {
		c.mu.Lock()
		c.started = true
		c.readerRunning = true
		c.mu.Unlock()
		go c.readControl() // which keeps the keepalive periods too
	})
}

// failLocked records the first fatal error and wakes every waiter, a wait for the
// peer's proof included. It also makes sure the peer learns: the QP goes to ERROR, so
// the peer's operations on it fail, and, once the Conn is started, the control reader is
// woken to close the control channel (before Start, the channel is still the
// handshake's). Called with mu held.
func (c *Conn) failLocked(err error) {
	first := c.err == nil
	if first {
		c.err = err
	}
	c.readChanges.Add(1)
	signal(c.readable)
	signal(c.writable)
	signal(c.drained)
	c.finishProofLocked(0, err)
	if first && !c.closing {
		c.stats.failed(err)
		c.qp.ToError()
		c.qpErrored = true
		if c.started {
			c.ctrl.SetReadDeadline(aLongTimeAgo)
		}
	}
}

// aLongTimeAgo is a deadline in the past, to wake a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// signal wakes one waiter on a capacity-1 channel without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	return c.setDeadlines("set deadline", t, true, true)
}

// SetReadDeadline sets the deadline of pending and future Reads.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.setDeadlines("set read deadline", t, true, false)
}

// SetWriteDeadline sets the deadline of pending and future Writes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.setDeadlines("set write deadline", t, false, true)
}

// setDeadlines sets the read deadline, the write deadline or both to t, and wakes a
// parked Read or Write, so that it waits on this deadline (deadline.set says when; the
// wait arms the deadline's timer as it parks again). After Close (or
// Abandon) began, it returns an error matching net.ErrClosed, as a closed net.Conn's
// setters do.
func (c *Conn) setDeadlines(op string, t time.Time, read, write bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return fmt.Errorf("rdma: %s: %w", op, net.ErrClosed)
	}
	if read && c.rdl.set(t) {
		signal(c.readable)
	}
	if write && c.wdl.set(t) {
		signal(c.writable)
	}
	return nil
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// LocalAddr returns the bootstrap connection's local address.
func (c *Conn) LocalAddr() net.Addr { return c.ctrl.LocalAddr() }

// RemoteAddr returns the bootstrap connection's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.ctrl.RemoteAddr() }
