package soft

import (
	"time"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// postErrs are the errors of PostSend and PostRecv, made once so that a rejected post
// allocates only its *verbs.PostError.
var postErrs = provider.PostErrors()

// outcome is how an attempt to execute a send WR ended.
type outcome uint8

const (
	outDone outcome = iota // the WR completed, successfully or not
	outRNR                 // the responder had no receive WQE and sent an RNR NAK
	outLost                // no response: broken link, or no connected peer
)

// PostSend posts work requests to the send queue. A WR is executed at once, inside
// PostSend, when nothing is queued ahead of it and no delay is injected; otherwise it
// queues behind the WRs ahead of it and the QP's timer executes it in order.
func (q *QP) PostSend(wrs []verbs.SendWR) error {
	q.sq.mu.Lock()
	var err error
	for i := range wrs {
		if e := q.postSendLocked(&wrs[i]); e != nil {
			err = &verbs.PostError{Index: i, Err: e}
			break
		}
	}
	q.sq.mu.Unlock()
	if q.State() == verbs.QPStateError {
		q.flushRecv()
	}
	return err
}

func (q *QP) postSendLocked(w *verbs.SendWR) error {
	st := q.State()
	if err := postErrs.CheckPostSend(st, q.closed.Load(), &q.caps, q.sq.posted-q.polled.SQ.Load(), w); err != nil {
		return err
	}
	e := wqe{
		id: w.ID, op: w.Opcode, flags: w.Flags, imm: w.Imm, raddr: w.RemoteAddr, rkey: w.RKey, sgl: w.SGL,
		rnrLeft: q.sq.rnrRetry, retryLeft: q.sq.retry,
	}
	if w.Flags&verbs.SendInline != 0 {
		if err := postErrs.CheckInline(&q.caps, w.Opcode, w.SGL); err != nil {
			return err
		}
		if err := q.copyInlineLocked(&e); err != nil {
			return err
		}
	}
	q.sq.posted++
	if st == verbs.QPStateError {
		// Posting to a QP in ERROR is allowed; the WR is flushed behind those before it.
		q.flushSendLocked()
		q.completeLocked(&e, verbs.WCWRFlushErr)
		return nil
	}

	var delay time.Duration
	if q.dev.fab.faultsUsed.Load() {
		delay = q.injectedDelay()
	}
	if q.sq.n > 0 || delay > 0 {
		if delay > 0 {
			e.due = time.Now().Add(delay)
		}
		q.enqueueLocked(&e)
		if q.sq.n == 1 {
			q.armLocked()
		}
		return nil
	}
	// Nothing ahead of it: execute it now.
	switch q.execute(&e) {
	case outDone:
		return nil
	case outRNR:
		if !q.rnrWaitLocked(&e) {
			q.completeLocked(&e, verbs.WCRNRRetryExcErr)
			return nil
		}
	case outLost:
		q.lostWaitLocked(&e)
	}
	q.enqueueLocked(&e)
	q.armLocked()
	return nil
}

// copyInlineLocked copies the payload of an inline WR, which CheckInline has checked,
// into the send queue's scratch buffer, so the caller may reuse its buffers as soon as
// PostSend returns.
//
// Real devices read inline data from any process memory. Soft can read only memory it
// knows: each SGE must lie in a registered region of this device (its LKey is used to find
// the region when it names one that holds the SGE, and is otherwise ignored, as for inline
// data on hardware).
func (q *QP) copyInlineLocked(e *wqe) error {
	buf := q.sq.scratch[:0]
	for _, s := range e.sgl {
		var b []byte
		ok := false
		if r := q.dev.mrs.Lookup(s.LKey); r != nil {
			b, ok = r.Slice(s.Addr, s.Length)
		}
		if !ok {
			if _, b = q.dev.mrs.ByAddr(s.Addr, s.Length); b == nil {
				return postErrs.InlineMemory
			}
		}
		buf = append(buf, b...)
	}
	e.inline = buf
	e.sgl = nil
	return nil
}

// injectedDelay returns the delivery delay injected on this QP and on its link.
func (q *QP) injectedDelay() time.Duration {
	return time.Duration(q.delay.Load()) + q.dev.fab.link(q.dev, q.sq.destDev).delay
}

// enqueueLocked appends e to the send queue, copying its SGL and inline payload into the
// slot's own storage.
func (q *QP) enqueueLocked(e *wqe) {
	i := q.sq.head + q.sq.n
	if i >= len(q.sq.ring) {
		i -= len(q.sq.ring)
	}
	s := &q.sq.ring[i]
	*s = *e
	if e.sgl != nil {
		k := i * q.caps.MaxSendSGE
		s.sgl = q.sq.sges[k : k+len(e.sgl) : k+len(e.sgl)]
		copy(s.sgl, e.sgl)
	}
	if e.inline != nil {
		if q.sq.inline == nil {
			q.sq.inline = make([]byte, len(q.sq.ring)*q.caps.MaxInlineData)
		}
		k := i * q.caps.MaxInlineData
		s.inline = q.sq.inline[k : k+len(e.inline) : k+len(e.inline)]
		copy(s.inline, e.inline)
	}
	q.sq.n++
}

func (q *QP) popSendLocked() {
	q.sq.ring[q.sq.head] = wqe{}
	q.sq.head++
	if q.sq.head == len(q.sq.ring) {
		q.sq.head = 0
	}
	q.sq.n--
}

// armLocked sets the timer for the head of the send queue.
func (q *QP) armLocked() {
	if q.sq.n == 0 {
		return
	}
	e := &q.sq.ring[q.sq.head]
	if e.forever {
		return
	}
	q.sqTimer().Reset(max(time.Until(e.due), 0))
}

// runSQ is the timer callback: it works through the send queue as far as it can.
func (q *QP) runSQ() {
	q.sq.mu.Lock()
	if q.closed.Load() {
		q.sq.mu.Unlock()
		return
	}
	q.driveLocked()
	q.sq.mu.Unlock()
	q.flushRecv()
}

// driveLocked executes queued WRs in order until the queue is empty or its head must wait,
// and sets the timer for the head. In ERROR it flushes the queue instead.
func (q *QP) driveLocked() {
	for q.sq.n > 0 {
		if q.State() == verbs.QPStateError {
			q.flushSendLocked()
			return
		}
		if q.State() != verbs.QPStateRTS {
			return // reset or closed under us; nothing to drive
		}
		e := &q.sq.ring[q.sq.head]
		if e.forever {
			return
		}
		if now := time.Now(); now.Before(e.due) {
			q.sqTimer().Reset(e.due.Sub(now))
			return
		}
		if e.ackWait {
			// The ACK timeout of the last attempt expired.
			e.ackWait = false
			if e.retryLeft == 0 {
				q.completeLocked(e, verbs.WCRetryExcErr)
				q.popSendLocked()
				continue
			}
			e.retryLeft--
			q.dev.stats.retries.Add(1)
		}
		switch q.execute(e) {
		case outDone:
			q.popSendLocked()
		case outRNR:
			if !q.rnrWaitLocked(e) {
				q.completeLocked(e, verbs.WCRNRRetryExcErr)
				q.popSendLocked()
			}
		case outLost:
			q.lostWaitLocked(e)
		}
	}
}

// rnrWaitLocked handles an RNR NAK for e: it schedules the retry after the responder's RNR
// timer and reports true, or reports false when e has no RNR retry left.
func (q *QP) rnrWaitLocked(e *wqe) bool {
	if q.sq.rnrRetry != 7 { // 7 retries forever
		if e.rnrLeft == 0 {
			return false
		}
		e.rnrLeft--
	}
	e.due = time.Now().Add(rnrDelay(q.sq.rnrTimer, q.dev.fab.scale))
	return true
}

// lostWaitLocked handles a request that got no response: the requester waits for its ACK
// timeout, then retransmits or gives up (see driveLocked). With timeout 0 it waits forever.
func (q *QP) lostWaitLocked(e *wqe) {
	d := ackTimeout(q.sq.timeout, q.dev.fab.scale)
	if d == 0 {
		e.forever = true
		return
	}
	e.ackWait = true
	e.due = time.Now().Add(d)
}

// completeLocked adds the completion of e to the send CQ with the given status. A
// successful completion releases, when polled, the slots of the unsignaled WRs completed
// before it. Any error other than a flush moves the QP to ERROR.
func (q *QP) completeLocked(e *wqe, status verbs.WCStatus) {
	wc := verbs.WorkCompletion{WRID: e.id, Status: status, Opcode: sendWCOpcode[e.op&7], QPN: q.qpn}
	switch status {
	case verbs.WCSuccess:
		wc.ByteLen = e.length
	case verbs.WCWRFlushErr:
		q.dev.stats.flushed.Add(1)
	default:
		q.dev.stats.errors.Add(1)
		q.fail()
	}
	slots := uint32(q.sq.unreported) + 1
	q.sq.unreported = 0
	if !q.sendCQ.push(&wc, q, slots, 0, false) {
		q.fail()
	}
}

var sendWCOpcode = [8]verbs.WCOpcode{
	verbs.OpRDMAWrite:        verbs.WCRDMAWrite,
	verbs.OpRDMAWriteWithImm: verbs.WCRDMAWrite,
	verbs.OpSend:             verbs.WCSend,
	verbs.OpSendWithImm:      verbs.WCSend,
	verbs.OpRDMARead:         verbs.WCRDMARead,
}

// execute makes one attempt at e. The caller holds q.sq.mu; execute takes the responder's
// rq.mu for the transfer. When the WR completes, its completion has been generated (if it
// is signaled or failed) by the time execute returns outDone.
func (q *QP) execute(e *wqe) outcome {
	// Resolve e's local buffers into q.sq.vec and set e.length: the inline copy, or the
	// SGL, each SGE of which must name a region of this QP's PD by its LKey and lie
	// inside it (with local write access for an RDMA READ). This is here, not in a
	// method, so that the RC core's check is the only call it costs.
	if e.flags&verbs.SendInline != 0 {
		q.sq.vec = append(q.sq.vec[:0], e.inline)
		e.length = uint32(len(e.inline))
	} else {
		vec, n, st := rc.ResolveLocal(&q.dev.mrs, &q.pd.refs, e.sgl, e.op == verbs.OpRDMARead, q.sq.vec[:0])
		if st != verbs.WCSuccess {
			q.completeLocked(e, st)
			return outDone
		}
		q.sq.vec, e.length = vec, n
	}
	faults := q.dev.fab.faultsUsed.Load()
	if faults && (q.broken.Load() || q.dev.fab.link(q.dev, q.sq.destDev).broken || q.dev.fab.pathLoses(q)) {
		return outLost
	}
	p := q.peerLocked()
	if p == nil || (faults && p.broken.Load()) {
		return outLost
	}
	p.rq.mu.Lock()
	if !p.acceptsLocked(q) {
		p.rq.mu.Unlock()
		return outLost
	}
	st, rnr := p.respondLocked(q, e)
	if rnr {
		q.sq.rnrTimer = p.rq.minRNR
	}
	p.rq.mu.Unlock()
	if rnr {
		q.dev.stats.rnrNAKs.Add(1)
		return outRNR
	}
	if st != verbs.WCSuccess {
		q.completeLocked(e, st)
		return outDone
	}
	q.tapLocked(e) // tap.go
	q.sq.psn = (q.sq.psn + packets(e.length, q.sq.mtu)) & psnMask
	q.dev.stats.wrs.Add(1)
	q.dev.stats.bytes.Add(uint64(e.length))
	if q.sigAll || e.flags&verbs.SendSignaled != 0 {
		q.completeLocked(e, verbs.WCSuccess)
	} else {
		q.sq.unreported++
	}
	return outDone
}

// peerLocked returns the destination QP, looking it up again if the one found before was
// destroyed, or nil if there is none.
func (q *QP) peerLocked() *QP {
	if p := q.sq.peer; p != nil && !p.closed.Load() {
		return p
	}
	q.sq.peer = nil
	if q.sq.destDev == nil {
		return nil
	}
	q.sq.peer = q.sq.destDev.qp(q.sq.destQPN)
	return q.sq.peer
}

// packets returns the number of packets, and so of PSNs, a message of n bytes takes.
func packets(n, mtu uint32) uint32 {
	if n == 0 || mtu == 0 {
		return 1
	}
	return (n + mtu - 1) / mtu
}
