package soft

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

const psnMask = 1<<24 - 1

// QP is a reliable-connected queue pair. It implements [verbs.QP]; see the package
// documentation for the rules it enforces.
//
// Its send queue (the requester) and its receive queue (the responder) have a mutex each,
// so that two QPs can send to each other at once: executing a request holds the
// requester's sq.mu and then the responder's rq.mu, never two of either.
type QP struct {
	dev    *device
	pd     *PD
	qpn    uint32
	sendCQ *CQ
	recvCQ *CQ
	caps   verbs.QPCaps
	sigAll bool

	// state is a verbs.QPState. Transitions made by the owner hold sq.mu and rq.mu; a
	// fatal error may set QPStateError with only one of them, or none (see fail).
	state  atomic.Int32
	closed atomic.Bool // set holding sq.mu and rq.mu

	broken atomic.Bool  // fault injection: requests to and from this QP are lost
	delay  atomic.Int64 // fault injection: delivery delay of this QP's requests

	// timer drives the send queue while its head waits: for its delivery time, an RNR
	// timer or an ACK timeout. It is also reset to fire at once after a fatal error, so
	// that the queues are flushed. Timer callbacks run on their own goroutines, so no
	// goroutine exists while nothing waits. It is made when first armed (sqTimer): most
	// QPs run every WR at once, from the posting goroutine, and never need one.
	timer atomic.Pointer[time.Timer]

	polled rc.Slots // send- and receive-queue slots released by polled completions

	sq sendQueue
	rq recvQueue

	// Storage for the queues' scratch buffer and local-buffer vectors, used when the
	// QP's capacities fit it (CreateQP), so that a QP of the usual shape allocates
	// less.
	scratchBuf [DefaultMaxInline]byte
	vecBuf     [4][]byte
}

// sendQueue is the requester side of a QP. Everything in it is guarded by mu.
type sendQueue struct {
	mu sync.Mutex

	ring    []wqe // WRs not yet executed to completion, oldest at head
	head, n int
	sges    []verbs.SGE // SGL storage of the ring's WRs, caps.MaxSendSGE per slot
	inline  []byte      // inline payload storage, caps.MaxInlineData per slot; nil until a WR with one is queued
	scratch []byte      // inline payload of the WR being posted
	vec     [][]byte    // resolved local buffers of the WR being executed

	posted     uint64 // WRs accepted; posted - polled.SQ is the slots in use
	unreported uint64 // WRs completed without a completion, released by the next one

	// Connection, set by ToRTR and ToRTS.
	sgid     verbs.GID // source GID: the entry the address vector's SGIDIndex names
	destDev  *device   // device of the destination GID, nil if no device has it
	destQPN  uint32
	av       verbs.AddressVector // as ToRTR was given it (path.go, query.go)
	mtu      uint32
	psn      uint32 // PSN of the next request
	timeout  uint8
	retry    uint8
	rnrRetry uint8
	rnrTimer uint8 // min_rnr_timer of the responder's last RNR NAK
	peer     *QP   // destination QP found by the last lookup
}

// recvQueue is the responder side of a QP. Everything in it is guarded by mu.
type recvQueue struct {
	mu sync.Mutex

	wq  rc.RecvQueue // the receive WQEs posted, and the count of them
	vec [][]byte     // resolved buffers of the receive WQE being filled

	// Connection, set by ToInit and ToRTR.
	access verbs.AccessFlags
	srcGID verbs.GID // GID of the connected requester (the RTR's DestGID)
	srcDev *device   // device of the connected requester
	srcQPN uint32
	mtu    uint32
	epsn   uint32 // PSN expected of the next request
	minRNR uint8
}

// wqe is a send work request as the send queue holds it.
type wqe struct {
	id     uint64
	op     verbs.Opcode
	flags  verbs.SendFlags
	imm    uint32
	raddr  uint64
	rkey   uint32
	sgl    []verbs.SGE
	inline []byte // payload copied at post time, for SendInline
	length uint32 // payload bytes, known once the local SGL is checked

	due       time.Time // earliest time of the next step; zero means now
	ackWait   bool      // the last attempt was lost; at due its ACK timeout expires
	forever   bool      // lost with ACK timeout 0: waits until flushed
	rnrLeft   uint8
	retryLeft uint8
}

// CreateQP creates an RC QP in the RESET state with exactly the capacities asked for.
func (p *PD) CreateQP(attr verbs.QPInitAttr) (verbs.QP, error) {
	d := p.ctx.dev
	scq, ok1 := attr.SendCQ.(*CQ)
	rcq, ok2 := attr.RecvCQ.(*CQ)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.ctx != p.ctx || rcq.ctx != p.ctx {
		return nil, fmt.Errorf("soft: create QP: send and receive CQs must come from the PD's context: %w", verbs.ErrInvalidArgument)
	}
	c := attr.Caps
	l := d.limits()
	if err := provider.CheckQPCaps(&l, c); err != nil {
		return nil, err
	}
	if err := d.fab.injectedFailure(AllocQP); err != nil {
		return nil, fmt.Errorf("soft: create QP: %w", err)
	}
	if !reserve(&d.nQP, d.attr.MaxQP) {
		return nil, fmt.Errorf("soft: create QP: device limit of %d QPs: %w", d.attr.MaxQP, verbs.ErrNoResources)
	}
	if err := p.refs.Acquire(); err != nil {
		d.nQP.Add(-1)
		return nil, fmt.Errorf("soft: create QP: %w", err)
	}
	if err := scq.use(); err != nil {
		p.refs.Release()
		d.nQP.Add(-1)
		return nil, fmt.Errorf("soft: create QP: send CQ: %w", err)
	}
	if err := rcq.use(); err != nil {
		scq.unuse()
		p.refs.Release()
		d.nQP.Add(-1)
		return nil, fmt.Errorf("soft: create QP: receive CQ: %w", err)
	}
	q := &QP{dev: d, pd: p, sendCQ: scq, recvCQ: rcq, caps: c, sigAll: attr.SignalAll}
	q.sq.ring = make([]wqe, c.MaxSendWR)
	// Storage of one type is made once and cut into capped parts, so that creating
	// a QP allocates less: the SGLs of both queues, the local buffers of both queues'
	// messages. The inline payloads of queued WRs get their storage when the first is
	// queued (enqueueLocked): a WR posted to an idle queue runs at once, from scratch.
	nsq, nrq := c.MaxSendWR*c.MaxSendSGE, c.MaxRecvWR*c.MaxRecvSGE
	sges := make([]verbs.SGE, nsq+nrq)
	q.sq.sges = sges[:nsq:nsq]
	q.rq.wq.Init(c.MaxRecvWR, c.MaxRecvSGE, sges[nsq:])
	if c.MaxInlineData <= len(q.scratchBuf) {
		q.sq.scratch = q.scratchBuf[:c.MaxInlineData:c.MaxInlineData]
	} else {
		q.sq.scratch = make([]byte, c.MaxInlineData)
	}
	vsq, vrq := max(c.MaxSendSGE, 1), max(c.MaxRecvSGE, 1)
	vec := q.vecBuf[:]
	if vsq+vrq > len(vec) {
		vec = make([][]byte, vsq+vrq)
	}
	q.sq.vec, q.rq.vec = vec[:0:vsq], vec[vsq:vsq]
	d.addQP(q)
	d.fab.live.qps.Add(1)
	return q, nil
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// State returns the QP's current state.
func (q *QP) State() verbs.QPState { return verbs.QPState(q.state.Load()) }

// Caps returns the QP's capacities, which are exactly those it was created with. The
// conformance suite uses it to fill the queues exactly.
func (q *QP) Caps() verbs.QPCaps { return q.caps }

func (q *QP) lock()   { q.sq.mu.Lock(); q.rq.mu.Lock() }
func (q *QP) unlock() { q.rq.mu.Unlock(); q.sq.mu.Unlock() }

// transition moves the QP from state from to state to, holding both queue locks.
func (q *QP) transition(op string, from, to verbs.QPState) error {
	return provider.Transition(q.qpn, &q.state, q.closed.Load(), op, from, to)
}

// ToInit moves the QP from RESET to INIT. Port must be 1 and PKeyIndex 0: soft devices
// have one port with one partition key.
func (q *QP) ToInit(attr verbs.InitAttr) error {
	if err := provider.CheckInit(q.qpn, &attr); err != nil {
		return err
	}
	q.lock()
	defer q.unlock()
	if err := q.transition("to INIT", verbs.QPStateReset, verbs.QPStateInit); err != nil {
		return err
	}
	q.rq.access = attr.Access
	return nil
}

// ToRTR moves the QP from INIT to RTR, connecting it to the QP numbered attr.DestQPN on
// the device whose GID is attr.Dest.DestGID. Neither needs to exist yet: requests to a
// destination that does not exist, or that is not connected back to this QP with matching
// PSNs, are lost as on a dead link.
func (q *QP) ToRTR(attr verbs.RTRAttr) error {
	ports := q.dev.attr.Ports
	l := q.dev.limits()
	if err := provider.CheckRTR(&l, q.qpn, &attr); err != nil {
		return err
	}
	sgid, ok := gidAt(ports[0], attr.Dest.SGIDIndex)
	if !ok { // the kernel fails to find the source GID's attributes
		return fmt.Errorf("soft: QP %#x: to RTR: GID index %d is empty: %w", q.qpn, attr.Dest.SGIDIndex, verbs.ErrInvalidArgument)
	}
	q.lock()
	defer q.unlock()
	if err := q.transition("to RTR", verbs.QPStateInit, verbs.QPStateRTR); err != nil {
		return err
	}
	dest := q.dev.fab.byGID[attr.Dest.DestGID]
	q.sq.destDev, q.sq.destQPN, q.sq.mtu, q.sq.peer = dest, attr.DestQPN, uint32(attr.PathMTU.Bytes()), nil
	q.sq.av = attr.Dest
	q.rq.srcDev, q.rq.srcQPN, q.rq.mtu = dest, attr.DestQPN, uint32(attr.PathMTU.Bytes())
	q.rq.epsn, q.rq.minRNR = attr.RQPSN, attr.MinRNRTimer
	q.sq.sgid, q.rq.srcGID = sgid.GID, attr.Dest.DestGID
	return nil
}

// ToRTS moves the QP from RTR to RTS. Timeout is the local ACK timeout (4.096 µs ×
// 2^Timeout, scaled by Options.TimeScale; 0 waits forever), RetryCount the retransmissions
// of a lost request, RNRRetry the retries after an RNR NAK (7 retries forever).
func (q *QP) ToRTS(attr verbs.RTSAttr) error {
	if err := provider.CheckRTS(q.qpn, &attr); err != nil {
		return err
	}
	q.lock()
	defer q.unlock()
	if err := q.transition("to RTS", verbs.QPStateRTR, verbs.QPStateRTS); err != nil {
		return err
	}
	q.sq.psn, q.sq.timeout, q.sq.retry, q.sq.rnrRetry = attr.SQPSN, attr.Timeout, attr.RetryCount, attr.RNRRetry
	return nil
}

// ToError moves the QP to ERROR from any state but RESET. Every outstanding send and
// receive WR completes with WR_FLUSH_ERR, in order, before ToError returns. RESET → ERROR
// fails with ErrInvalidState and changes nothing: the InfiniBand specification has no such
// transition, and the kernel (ib_modify_qp_is_ok) refuses it with EINVAL.
func (q *QP) ToError() error {
	q.lock()
	defer q.unlock()
	if err := provider.ToError(q.qpn, &q.state, q.closed.Load()); err != nil {
		return err
	}
	q.flushSendLocked()
	q.flushRecvLocked()
	return nil
}

// ToReset moves the QP to RESET from any state. Its queues are emptied without
// completions, and its completions not yet polled are removed from its CQs.
func (q *QP) ToReset() error {
	q.lock()
	defer q.unlock()
	if q.closed.Load() {
		return fmt.Errorf("soft: QP %#x: to RESET: %w", q.qpn, verbs.ErrClosed)
	}
	q.state.Store(int32(verbs.QPStateReset))
	q.stopTimer()
	q.discardLocked(false)
	q.sq.reset(q.polled.SQ.Load())
	q.rq.reset(q.polled.RQ.Load())
	return nil
}

// reset forgets the connection and accounts every slot as free: polled is the number of
// slots polled so far, and no further poll releases any.
func (s *sendQueue) reset(polled uint64) {
	s.posted, s.unreported = polled, 0
	s.destDev, s.destQPN, s.mtu, s.psn, s.peer, s.sgid = nil, 0, 0, 0, nil, verbs.GID{}
	s.av = verbs.AddressVector{}
	s.timeout, s.retry, s.rnrRetry, s.rnrTimer = 0, 0, 0, 0
}

func (r *recvQueue) reset(polled uint64) {
	r.wq.Reset(polled)
	r.access, r.srcDev, r.srcQPN, r.mtu, r.epsn, r.minRNR, r.srcGID = 0, nil, 0, 0, 0, 0, verbs.GID{}
}

// discardLocked empties both queues without completions and removes the QP's completions
// from its CQs, unless destroying says the fabric leaves a destroyed QP's completions
// there (LeaveDestroyedCompletions). After it, no poll releases slots of this QP that
// matter to anyone. The caller holds both locks.
func (q *QP) discardLocked(destroying bool) {
	clear(q.sq.ring)
	q.sq.head, q.sq.n = 0, 0
	q.rq.wq.Discard()
	if destroying && q.dev.fab.teardown.leaveCompletions.Load() {
		return
	}
	q.sendCQ.forget(q)
	q.recvCQ.forget(q)
}

// Close destroys the QP in any state. Outstanding WRs are discarded without completions
// and the QP's completions not yet polled are removed from its CQs. Peers that still send
// to it see a dead link.
func (q *QP) Close() error {
	q.lock()
	if q.closed.Load() {
		q.unlock()
		return fmt.Errorf("soft: destroy QP %#x: %w", q.qpn, verbs.ErrClosed)
	}
	q.closed.Store(true)
	q.discardLocked(true)
	q.sq.peer = nil
	q.unlock()
	q.stopTimer()
	q.dev.removeQP(q)
	q.sendCQ.unuse()
	q.recvCQ.unuse()
	q.pd.refs.Release()
	q.dev.nQP.Add(-1)
	q.dev.fab.live.qps.Add(-1)
	return nil
}

// fail moves the QP to ERROR as a fatal asynchronous error does, and has its timer flush
// both queues soon. It takes no lock, so it may be called holding any of them.
func (q *QP) fail() {
	if rc.Fail(&q.state, &q.closed) {
		q.sqTimer().Reset(0)
	}
}

// sqTimer returns the QP's timer, stopped when new, making it on first use. Callers
// race (fail takes no lock): the first to store its timer wins, and a loser's, never
// started, is dropped.
func (q *QP) sqTimer() *time.Timer {
	if t := q.timer.Load(); t != nil {
		return t
	}
	t := time.AfterFunc(time.Hour, q.runSQ)
	t.Stop()
	if !q.timer.CompareAndSwap(nil, t) {
		return q.timer.Load()
	}
	return t
}

// stopTimer stops the QP's timer, if it has one.
func (q *QP) stopTimer() {
	if t := q.timer.Load(); t != nil {
		t.Stop()
	}
}

// flushSendLocked completes every WR of the send queue with WR_FLUSH_ERR, signaled or not,
// as a WR that completes in error always produces a completion. The caller holds sq.mu.
func (q *QP) flushSendLocked() {
	for q.sq.n > 0 {
		q.completeLocked(&q.sq.ring[q.sq.head], verbs.WCWRFlushErr)
		q.popSendLocked()
	}
}

// flushRecvLocked completes every receive WR with WR_FLUSH_ERR. The caller holds rq.mu.
func (q *QP) flushRecvLocked() {
	for q.rq.wq.Len() > 0 {
		q.recvCompleteLocked(&verbs.WorkCompletion{WRID: q.rq.wq.Head().ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn}, false)
	}
}

// flushRecv flushes the receive queue if the QP is in ERROR. The caller holds no rq.mu.
func (q *QP) flushRecv() {
	q.rq.mu.Lock()
	if q.State() == verbs.QPStateError && !q.closed.Load() {
		q.flushRecvLocked()
	}
	q.rq.mu.Unlock()
}
