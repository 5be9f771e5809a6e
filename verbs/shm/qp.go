package shm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// QP is a reliable-connected queue pair. It implements [verbs.QP] with the RC rules of
// verbs/soft (see the package documentation), between processes.
//
// Its send queue (the requester) and receive queue (the responder) have a mutex each. The
// requester places requests in its connection's channel to the destination QP ahead of
// their responses (pipelined, up to maxInflight); the responder executes them in PSN
// order and answers each in order. An RNR NAK or a loss of the oldest makes the
// requester abandon the ones behind it (the responder drops them: out of sequence) and
// retransmit from the oldest, go-back-N, which keeps execution and completion in order.
type QP struct {
	dev    *device
	pd     *PD
	qpn    uint32
	sendCQ *CQ
	recvCQ *CQ
	caps   verbs.QPCaps
	sigAll bool

	ln   *qpListener // its socket, named after its number (see qpSocketName)
	maps mapQuota    // the mappings its connections make (mapquota.go)

	state  atomic.Int32 // a verbs.QPState
	closed atomic.Bool

	broken atomic.Bool  // fault injection: requests to and from this QP are lost
	delay  atomic.Int64 // fault injection: delivery delay of this QP's requests

	// timer drives the send queue while its head waits for an RNR or ACK timeout; it is
	// also reset to fire at once after a fatal error, to flush the queues.
	timer *time.Timer

	polled rc.Slots // send- and receive-queue slots released by polled completions

	sq sendQueue
	rq recvQueue

	in  atomic.Pointer[inbound]  // the peer's connection to this QP, which Polls drive
	out atomic.Pointer[peerConn] // sq.conn, for Polls to drive
}

// sendQueue is the requester side of a QP, guarded by mu.
type sendQueue struct {
	mu sync.Mutex

	ring    []wqe
	head, n int
	sges    []verbs.SGE
	inline  []byte
	scratch []byte
	vec     [][]byte
	out     []byte // the request record being built

	posted     uint64
	unreported uint64

	sgid     verbs.GID // the GID the address vector's SGIDIndex names: the hello's source
	destGID  verbs.GID
	destQPN  uint32
	av       verbs.AddressVector
	psn      uint32 // PSN of the head WR's request
	timeout  uint8
	retry    uint8
	rnrRetry uint8

	conn     *peerConn // connection to the destination QP, nil until first needed
	dialErr  error     // why the last attempt to make conn, or to map a region through it, failed (TransportCause); nil once a dial succeeds
	inflight int       // WRs from the head whose requests await their responses
	querying bool      // the head WR's region query awaits its answer (inflight is 0)
	deadline time.Time // when busy, the end of the ACK timeout of the oldest answer awaited
	waiting  bool      // the head WR waits for the timer (inflight is 0)
	fence    bool      // a request in flight is one this side expects refused: none may follow
}

// recvQueue is the responder side of a QP, guarded by mu.
type recvQueue struct {
	mu sync.Mutex

	wq  rc.RecvQueue // the receive WQEs posted, and the count of them
	vec [][]byte

	access verbs.AccessFlags
	srcGID verbs.GID
	srcQPN uint32
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
	inline []byte
	length uint32

	due       time.Time // with an injected delay, when the request may go
	queried   bool      // the region rkey names was asked for in this attempt
	ackWait   bool      // the last attempt was lost: when the timer fires, its ACK timeout expired
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
		return nil, fmt.Errorf("shm: create QP: send and receive CQs must come from the PD's context: %w", verbs.ErrInvalidArgument)
	}
	c := attr.Caps
	if err := provider.CheckQPCaps(&limits, c); err != nil {
		return nil, err
	}
	if err := d.p.injectedFailure(allocQP); err != nil {
		return nil, fmt.Errorf("shm: create QP: %w", err)
	}
	if !reserve(&d.nQP, maxQP) {
		return nil, fmt.Errorf("shm: create QP: device limit of %d QPs: %w", maxQP, verbs.ErrNoResources)
	}
	if err := p.refs.Acquire(); err != nil {
		d.nQP.Add(-1)
		return nil, fmt.Errorf("shm: create QP: %w", err)
	}
	if err := scq.use(); err != nil {
		p.refs.Release()
		d.nQP.Add(-1)
		return nil, fmt.Errorf("shm: create QP: send CQ: %w", err)
	}
	if err := rcq.use(); err != nil {
		scq.unuse()
		p.refs.Release()
		d.nQP.Add(-1)
		return nil, fmt.Errorf("shm: create QP: receive CQ: %w", err)
	}
	q := &QP{dev: d, pd: p, sendCQ: scq, recvCQ: rcq, caps: c, sigAll: attr.SignalAll}
	if err := q.maps.open(); err != nil {
		rcq.unuse()
		scq.unuse()
		p.refs.Release()
		d.nQP.Add(-1)
		return nil, fmt.Errorf("shm: create QP: %w", err)
	}
	q.sq.ring = make([]wqe, c.MaxSendWR)
	q.sq.sges = make([]verbs.SGE, c.MaxSendWR*c.MaxSendSGE)
	q.sq.inline = make([]byte, c.MaxSendWR*c.MaxInlineData)
	q.sq.scratch = make([]byte, c.MaxInlineData)
	q.sq.vec = make([][]byte, 0, max(c.MaxSendSGE, 1))
	q.sq.out = make([]byte, 0, requestLen)
	q.rq.wq.Init(c.MaxRecvWR, c.MaxRecvSGE, nil)
	q.rq.vec = make([][]byte, 0, max(c.MaxRecvSGE, 1))
	ln, err := listenQP(q)
	if err != nil {
		q.maps.close()
		rcq.unuse()
		scq.unuse()
		p.refs.Release()
		d.nQP.Add(-1)
		return nil, fmt.Errorf("shm: create QP: %w: %w", verbs.ErrNoResources, err)
	}
	q.ln = ln
	q.timer = time.AfterFunc(time.Hour, q.runSQ)
	q.timer.Stop()
	d.qpMu.Lock()
	d.qps[q.qpn] = q
	d.qpMu.Unlock()
	scq.addFeeder(q)
	if rcq != scq {
		rcq.addFeeder(q)
	}
	if !d.p.track(ln) {
		q.Close()
		return nil, fmt.Errorf("shm: create QP: provider closed: %w", verbs.ErrClosed)
	}
	d.p.wg.Add(1)
	go q.acceptLoop()
	return q, nil
}

// listenQP gives q a number no other QP of the network namespace has, by binding the
// socket that number names, and returns the socket.
func listenQP(q *QP) (*qpListener, error) {
	var b [4]byte
	for range 64 {
		rand.Read(b[:])
		qpn := binary.LittleEndian.Uint32(b[:]) & qpnMask
		if qpn < 0x100 {
			continue
		}
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: qpSocketName(qpn), Net: "unixpacket"})
		if err == nil {
			q.qpn = qpn
			return &qpListener{UnixListener: ln, done: make(chan struct{})}, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("listen: %w", err)
		}
	}
	return nil, errors.New("no free QP number")
}

// qpListener is a QP's socket. Closing it also ends acceptLoop's pause after a failed
// accept.
type qpListener struct {
	*net.UnixListener
	done chan struct{} // closed by Close
	once sync.Once

	mu    sync.Mutex
	conns map[*net.UnixConn]struct{} // accepted and being served
}

// Close closes the socket, ends acceptLoop's pause and closes the connections the
// socket accepted: their serve goroutines end, unmapping the channels, and the peers
// see a dead link at once rather than requests dropped until they give up.
func (l *qpListener) Close() error {
	l.once.Do(func() { close(l.done) })
	err := l.UnixListener.Close()
	l.mu.Lock()
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	return err
}

// adopt records c, a connection the socket accepted, for Close to close; it reports
// false, leaving c to the caller, if Close came first.
func (l *qpListener) adopt(c *net.UnixConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done: // Close takes the connections after done, under mu
		return false
	default:
	}
	if l.conns == nil {
		l.conns = map[*net.UnixConn]struct{}{}
	}
	l.conns[c] = struct{}{}
	return true
}

// release forgets c, which its serve goroutine closed.
func (l *qpListener) release(c *net.UnixConn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// State returns the QP's current state.
func (q *QP) State() verbs.QPState { return verbs.QPState(q.state.Load()) }

// Caps returns the QP's capacities, exactly those it was created with.
func (q *QP) Caps() verbs.QPCaps { return q.caps }

func (q *QP) lock()   { q.sq.mu.Lock(); q.rq.mu.Lock() }
func (q *QP) unlock() { q.rq.mu.Unlock(); q.sq.mu.Unlock() }

func (q *QP) transition(op string, from, to verbs.QPState) error {
	return provider.Transition(q.qpn, &q.state, q.closed.Load(), op, from, to)
}

// ToInit moves the QP from RESET to INIT. Port must be 1 and PKeyIndex 0.
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

// ToRTR moves the QP from INIT to RTR, connecting it to QP attr.DestQPN of the device
// whose GID is attr.Dest.DestGID, in this process or another. Neither needs to exist yet:
// requests to a destination that does not exist or is not connected back are lost.
func (q *QP) ToRTR(attr verbs.RTRAttr) error {
	if err := provider.CheckRTR(&limits, q.qpn, &attr); err != nil {
		return err
	}
	gids := q.dev.attr.Ports[0].GIDs
	if int(attr.Dest.SGIDIndex) >= len(gids) {
		return fmt.Errorf("shm: QP %#x: to RTR: GID index %d is empty: %w", q.qpn, attr.Dest.SGIDIndex, verbs.ErrInvalidArgument)
	}
	q.lock()
	defer q.unlock()
	if err := q.transition("to RTR", verbs.QPStateInit, verbs.QPStateRTR); err != nil {
		return err
	}
	q.sq.sgid = gids[attr.Dest.SGIDIndex].GID
	q.sq.destGID, q.sq.destQPN, q.sq.av = attr.Dest.DestGID, attr.DestQPN, attr.Dest
	q.rq.srcGID, q.rq.srcQPN, q.rq.minRNR, q.rq.epsn = attr.Dest.DestGID, attr.DestQPN, attr.MinRNRTimer, attr.RQPSN
	return nil
}

// ToRTS moves the QP from RTR to RTS.
func (q *QP) ToRTS(attr verbs.RTSAttr) error {
	if err := provider.CheckRTS(q.qpn, &attr); err != nil {
		return err
	}
	q.lock()
	defer q.unlock()
	if err := q.transition("to RTS", verbs.QPStateRTR, verbs.QPStateRTS); err != nil {
		return err
	}
	q.sq.timeout, q.sq.retry, q.sq.rnrRetry, q.sq.psn = attr.Timeout, attr.RetryCount, attr.RNRRetry, attr.SQPSN
	return nil
}

// ToError moves the QP to ERROR from any state but RESET; every outstanding WR completes
// with WR_FLUSH_ERR, in order, before it returns.
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

// ToReset moves the QP to RESET from any state, emptying its queues without completions
// and removing its unpolled completions from its CQs.
func (q *QP) ToReset() error {
	q.lock()
	defer q.unlock()
	if q.closed.Load() {
		return fmt.Errorf("shm: QP %#x: to RESET: %w", q.qpn, verbs.ErrClosed)
	}
	q.state.Store(int32(verbs.QPStateReset))
	q.timer.Stop()
	q.discardLocked()
	s := &q.sq
	s.posted, s.unreported = q.polled.SQ.Load(), 0
	s.sgid, s.destGID, s.destQPN, s.av = verbs.GID{}, verbs.GID{}, 0, verbs.AddressVector{}
	s.timeout, s.retry, s.rnrRetry, s.psn = 0, 0, 0, 0
	s.dialErr = nil
	r := &q.rq
	r.wq.Reset(q.polled.RQ.Load())
	r.access, r.srcGID, r.srcQPN, r.minRNR, r.epsn = 0, verbs.GID{}, 0, 0, 0
	return nil
}

// discardLocked empties both queues without completions, drops the connection and
// removes the QP's completions from its CQs. The caller holds both locks.
func (q *QP) discardLocked() {
	clear(q.sq.ring)
	q.sq.head, q.sq.n, q.sq.inflight, q.sq.querying, q.sq.waiting = 0, 0, 0, false, false
	q.rq.wq.Discard()
	if q.sq.conn != nil {
		q.sq.conn.close()
		q.sq.conn = nil
		q.out.Store(nil)
	}
	q.sendCQ.forget(q)
	q.recvCQ.forget(q)
}

// TransportCause returns why the QP's last attempt to connect to its destination QP, or
// to map the destination's region through the connection, failed, or nil if it
// connected since or never tried (verbs.TransportCauser). A
// request that cannot be sent for want of the connection is retried as a lost one, so
// a process out of file descriptors sees its requests end in WCRetryExcErr, as if the
// peer had not answered: this names the real cause. RESET clears it.
func (q *QP) TransportCause() error {
	q.sq.mu.Lock()
	defer q.sq.mu.Unlock()
	return q.sq.dialErr
}

// Close destroys the QP in any state. Peers that still send to it see a dead link.
func (q *QP) Close() error {
	q.lock()
	if q.closed.Load() {
		q.unlock()
		return fmt.Errorf("shm: destroy QP %#x: %w", q.qpn, verbs.ErrClosed)
	}
	q.closed.Store(true)
	q.discardLocked()
	q.unlock()
	q.timer.Stop()
	q.ln.Close()
	q.dev.p.untrack(q.ln)
	q.dev.qpMu.Lock()
	delete(q.dev.qps, q.qpn)
	q.dev.qpMu.Unlock()
	q.sendCQ.removeFeeder(q)
	q.recvCQ.removeFeeder(q)
	q.sendCQ.unuse()
	q.recvCQ.unuse()
	q.maps.close()
	q.pd.refs.Release()
	q.dev.nQP.Add(-1)
	return nil
}

// fail moves the QP to ERROR as a fatal error does and has its timer flush both queues.
// It takes no lock.
func (q *QP) fail() {
	if rc.Fail(&q.state, &q.closed) {
		q.timer.Reset(0)
	}
}

func (q *QP) flushSendLocked() {
	q.abandonLocked()
	q.sq.querying, q.sq.waiting = false, false
	for q.sq.n > 0 {
		q.completeLocked(&q.sq.ring[q.sq.head], verbs.WCWRFlushErr)
		q.popSendLocked()
	}
}

// busy reports whether the requester awaits an answer: responses or a region.
func (s *sendQueue) busy() bool { return s.inflight > 0 || s.querying }

// abandonLocked forgets the requests in flight: their responses, when they come, are
// skipped. The caller holds sq.mu.
func (q *QP) abandonLocked() {
	if q.sq.conn != nil {
		q.sq.conn.skip += q.sq.inflight
	}
	q.sq.inflight = 0
}

func (q *QP) flushRecvLocked() {
	for q.rq.wq.Len() > 0 {
		q.recvCompleteLocked(&verbs.WorkCompletion{WRID: q.rq.wq.Head().ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn}, false)
	}
}

// flushRecv flushes the receive queue if the QP is in ERROR.
func (q *QP) flushRecv() {
	q.rq.mu.Lock()
	if q.State() == verbs.QPStateError && !q.closed.Load() {
		q.flushRecvLocked()
	}
	q.rq.mu.Unlock()
}

// Query reports the QP's state and the connection its RTR transition set up. It
// implements [verbs.QPQuerier].
func (q *QP) Query() (verbs.QPAttr, error) {
	if q.closed.Load() {
		return verbs.QPAttr{}, fmt.Errorf("shm: QP %#x: query: %w", q.qpn, verbs.ErrClosed)
	}
	q.sq.mu.Lock()
	defer q.sq.mu.Unlock()
	a := verbs.QPAttr{State: q.State(), DestQPN: q.sq.destQPN, Dest: q.sq.av}
	if q.sq.destQPN != 0 || q.State() >= verbs.QPStateRTR {
		a.PathMTU = verbs.MTU4096
	}
	return a, nil
}

var _ verbs.QPQuerier = (*QP)(nil)
