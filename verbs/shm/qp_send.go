package shm

import (
	"time"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// postErrs are the errors of PostSend and PostRecv, made once so that a rejected post
// allocates only its *verbs.PostError.
var postErrs = provider.PostErrors()

// Opcodes as the wire carries them (verbs.Opcode values).
const (
	opWrite        = uint8(verbs.OpRDMAWrite)
	opWriteWithImm = uint8(verbs.OpRDMAWriteWithImm)
	opSend         = uint8(verbs.OpSend)
	opSendWithImm  = uint8(verbs.OpSendWithImm)
	opRead         = uint8(verbs.OpRDMARead)

	maxWCStatus = uint32(verbs.WCTMRndvIncomplete)
)

// PostSend posts work requests to the send queue and places their requests in the
// connection's channel as far as the pipeline allows (see kickLocked): each payload
// copied into the peer's region (RDMA WRITE) or the request record (SEND). The rest go
// as responses come back, on whichever goroutine handles them (a Poll or readLoop).
func (q *QP) PostSend(wrs []verbs.SendWR) error {
	q.sq.mu.Lock()
	var err error
	for i := range wrs {
		if e := q.postSendLocked(&wrs[i]); e != nil {
			err = &verbs.PostError{Index: i, Err: e}
			break
		}
	}
	q.kickLocked()
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
	if d := q.delay.Load(); d > 0 {
		e.due = time.Now().Add(time.Duration(d))
	}
	q.sq.posted++
	if st == verbs.QPStateError {
		q.flushSendLocked()
		q.completeLocked(&e, verbs.WCWRFlushErr)
		return nil
	}
	q.enqueueLocked(&e)
	return nil
}

// copyInlineLocked copies an inline WR's payload, which CheckInline has checked, at
// post time. As with verbs/soft, the
// bytes must lie in memory registered on this device.
func (q *QP) copyInlineLocked(e *wqe) error {
	buf := q.sq.scratch[:0]
	q.dev.mrMu.RLock()
	defer q.dev.mrMu.RUnlock()
	for _, s := range e.sgl {
		var b []byte
		ok := false
		if m := q.dev.lookupMRLocked(s.LKey); m != nil {
			b, ok = m.slice(s.Addr, s.Length)
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

// runSQ is the timer callback: the head's RNR or ACK timeout expired, the oldest answer
// awaited is late, or the QP failed.
func (q *QP) runSQ() {
	if pc := q.out.Load(); pc != nil {
		pc.drive() // responses that rang no doorbell, before any is declared lost
	}
	q.sq.mu.Lock()
	if q.closed.Load() {
		q.sq.mu.Unlock()
		return
	}
	q.sq.waiting = false
	if q.sq.n > 0 && q.State() == verbs.QPStateRTS {
		e := &q.sq.ring[q.sq.head]
		if q.sq.busy() {
			if d := time.Until(q.sq.deadline); d > 0 || rc.ACKTimeout(q.sq.timeout) == 0 { // fired for an earlier wait
				if d > 0 {
					q.timer.Reset(d)
				}
				q.sq.mu.Unlock()
				return
			}
			// No answer within the ACK timeout: the requests in flight are lost. The
			// connection goes, so that a late answer cannot be taken for the
			// retransmission's.
			q.sq.inflight, q.sq.querying = 0, false
			q.sq.conn.close()
			q.sq.conn = nil
			q.out.Store(nil)
			e.ackWait = true
		}
		if e.ackWait {
			e.ackWait = false
			if e.retryLeft == 0 {
				q.completeLocked(e, verbs.WCRetryExcErr)
				q.popSendLocked()
			} else {
				e.retryLeft--
			}
		}
	}
	q.kickLocked()
	q.sq.mu.Unlock()
	q.flushRecv()
}

// kickLocked places the requests of the WRs not yet in flight in the channel, in order,
// while the pipeline has room and nothing waits: it runs local checks, asks the
// responder for the region a WR names if this side has not mapped it, copies the payload
// and publishes the request. What needs an empty pipeline (a region query, a new
// connection, a local error's completion, a delay, a loss) waits for the WRs ahead to be
// answered. WRs that fail locally complete at once and the next one starts. In ERROR it
// flushes the queue.
func (q *QP) kickLocked() {
	q.kickSomeLocked()
	if c := q.sq.conn; c != nil {
		c.setStalled(q.sq.inflight > 0 && q.sq.n > q.sq.inflight && !q.sq.querying && !q.sq.waiting)
	}
}

// kickSomeLocked is kickLocked's loop: it publishes what it can.
func (q *QP) kickSomeLocked() {
	for q.sq.n > q.sq.inflight && !q.sq.querying && !q.sq.waiting {
		if q.sq.fence {
			if q.sq.inflight > 0 {
				return
			}
			q.sq.fence = false
		}
		switch q.State() {
		case verbs.QPStateError:
			q.flushSendLocked()
			return
		case verbs.QPStateRTS:
		default:
			return
		}
		head := q.sq.inflight == 0
		i := q.sq.head + q.sq.inflight
		if i >= len(q.sq.ring) {
			i -= len(q.sq.ring)
		}
		e := &q.sq.ring[i]
		if e.forever {
			if c := q.sq.conn; !head || (c != nil && !c.dead.Load()) {
				return
			}
			// Its connection ended (onConnDown, or a Poll took the drop after it):
			// no answer will come.
			e.forever = false
			q.lostLocked(e, true)
			continue
		}
		if d := time.Until(e.due); !e.due.IsZero() && d > 0 {
			if head {
				q.sq.waiting = true
				q.timer.Reset(d)
			}
			return
		}
		if q.loses() {
			if head {
				q.lostLocked(e, false)
				continue
			}
			return
		}
		if q.sq.conn == nil || q.sq.conn.dead.Load() {
			if !head {
				return
			}
			if q.sq.conn != nil {
				q.sq.conn.close()
				q.sq.conn = nil
				q.out.Store(nil)
			}
			c, err := dialPeer(q)
			if err != nil {
				q.sq.dialErr = err
				q.lostLocked(e, true)
				continue
			}
			q.sq.conn, q.sq.dialErr = c, nil
			q.out.Store(c)
		}
		c := q.sq.conn
		if q.sq.inflight+c.skip >= maxInflight {
			return // the responses awaited fill the response ring
		}
		remote := e.op == verbs.OpRDMAWrite || e.op == verbs.OpRDMAWriteWithImm || e.op == verbs.OpRDMARead
		if remote && !e.queried && c.region(e.rkey) == nil && q.wrLength(e) > 0 {
			if !head {
				return
			}
			m := msg{kind: msgMRQuery, rkey: e.rkey}
			if ok, err := c.push(m.encode(q.sq.out)); !ok || err != nil {
				c.fail(err) // an empty ring that is full: the responder broke it
				q.lostLocked(e, true)
				continue
			}
			q.sq.querying = true
			q.armLocked()
			return
		}
		st, out, doubtful := q.prepareLocked(e, c)
		if st != verbs.WCSuccess {
			if head {
				q.completeLocked(e, st)
				q.popSendLocked()
				continue
			}
			return
		}
		ok, err := c.push(out)
		if err != nil || (!ok && head && c.skip == 0) { // full, and nothing will empty it
			c.fail(err)
			if head {
				q.lostLocked(e, true)
				continue
			}
			return // readLoop sees the connection dead and declares the requests lost
		}
		if !ok {
			return // the ring is full: responses make room
		}
		if head {
			q.armLocked()
		}
		q.sq.inflight++
		q.sq.fence = doubtful
	}
}

// armLocked arms the ACK timeout of the first request or region query of an empty
// pipeline: if no answer comes before it, the requests in flight are lost.
func (q *QP) armLocked() {
	if d := rc.ACKTimeout(q.sq.timeout); d > 0 {
		q.sq.deadline = time.Now().Add(d)
		q.timer.Reset(d)
	}
}

// wrLength returns the payload length of e from its SGL.
func (q *QP) wrLength(e *wqe) uint64 {
	if e.flags&verbs.SendInline != 0 {
		return uint64(len(e.inline))
	}
	var n uint64
	for _, s := range e.sgl {
		n += uint64(s.Length)
	}
	return n
}

// prepareLocked resolves e's local buffers, moves its payload (into the peer's mapped
// region for an RDMA WRITE that this side's copy of the region's bounds and rights
// allows; into the record for a SEND) and returns the request record. A local error is
// returned as a completion status. doubtful reports an RDMA request that this side's
// copy of the region refuses: the responder will most likely refuse it too, and no
// request may follow it before its answer, lest that one's payload land in a region
// whose QP the refusal moves to ERROR.
func (q *QP) prepareLocked(e *wqe, c *peerConn) (st verbs.WCStatus, rec []byte, doubtful bool) {
	q.dev.mrMu.RLock()
	defer q.dev.mrMu.RUnlock()
	if st := q.resolveLocalLocked(e); st != verbs.WCSuccess {
		return st, nil, false
	}
	psn := (q.sq.psn + uint32(q.sq.inflight)) & qpnMask
	m := msg{kind: msgRequest, op: uint8(e.op), imm: e.imm, rkey: e.rkey, length: e.length, addr: e.raddr, psn: psn}
	if e.flags&verbs.SendSolicited != 0 {
		m.flags = reqSolicited
	}
	if q.sigAll || e.flags&verbs.SendSignaled != 0 || e.op == verbs.OpRDMARead || q.sq.inflight >= maxInflight/2 {
		m.flags |= reqNotify
	}
	out := m.encode(q.sq.out)
	switch e.op {
	case verbs.OpSend, verbs.OpSendWithImm:
		if e.length > maxSendPayload {
			return verbs.WCLocLenErr, nil, false
		}
		for _, b := range q.sq.vec {
			out = append(out, b...)
		}
	case verbs.OpRDMAWrite, verbs.OpRDMAWriteWithImm:
		if e.length > 0 {
			doubtful = true
			if r := c.region(e.rkey); r != nil && r.writable {
				if dst, ok := r.slice(e.raddr, e.length); ok {
					gather(dst, q.sq.vec)
					doubtful = false
				}
			}
		}
	case verbs.OpRDMARead:
		if e.length > 0 {
			r := c.region(e.rkey)
			_, ok := r.slice(e.raddr, e.length)
			doubtful = !ok || !r.readable
		}
	}
	q.sq.out = out[:0]
	return verbs.WCSuccess, out, doubtful
}

// resolveLocalLocked checks e's local buffers and resolves them into q.sq.vec; it sets
// e.length. The caller holds q.dev.mrMu for reading.
func (q *QP) resolveLocalLocked(e *wqe) verbs.WCStatus {
	vec := q.sq.vec[:0]
	if e.flags&verbs.SendInline != 0 {
		q.sq.vec = append(vec, e.inline)
		e.length = uint32(len(e.inline))
		return verbs.WCSuccess
	}
	vec, n, st := rc.ResolveLocal(&q.dev.mrs, &q.pd.refs, e.sgl, e.op == verbs.OpRDMARead, vec)
	if st != verbs.WCSuccess {
		return st
	}
	q.sq.vec = vec
	e.length = n
	return verbs.WCSuccess
}

// lostLocked handles a request that got no response: the requester waits for its ACK
// timeout, then retransmits or gives up. With timeout 0 it waits forever, as hardware
// does, unless the link is known dead (the peer's device is gone): then it gives up at
// once rather than hang.
func (q *QP) lostLocked(e *wqe, dead bool) {
	e.queried = false
	d := rc.ACKTimeout(q.sq.timeout)
	if d == 0 {
		if dead {
			q.completeLocked(e, verbs.WCRetryExcErr)
			q.popSendLocked()
			return
		}
		e.forever = true
		return
	}
	e.ackWait = true
	q.sq.waiting = true
	q.timer.Reset(d)
}

// onRegion handles the answer to a region query of the head WR.
func (q *QP) onRegion(c *peerConn, m *msg, fd int) {
	q.sq.mu.Lock()
	defer q.sq.mu.Unlock()
	if q.sq.conn != c || q.sq.n == 0 {
		closeFD(fd)
		return
	}
	if !q.sq.querying { // an answer to a question not asked: readLoop ends the connection
		closeFD(fd)
		c.fail(errMalformed)
		return
	}
	q.sq.querying = false
	e := &q.sq.ring[q.sq.head]
	e.queried = true
	if m.ok != (fd >= 0) || m.rkey != e.rkey { // a region without its memory, or another one
		closeFD(fd)
		c.fail(errMalformed)
		q.lostLocked(e, true)
	} else if m.ok {
		if err := c.addRegion(m, fd); err != nil {
			q.sq.dialErr = err // the cause of the loss (TransportCause)
			c.fail(err)
			q.lostLocked(e, true)
		}
	} else {
		closeFD(fd)
	}
	q.kickLocked()
}

// onResponse handles the response to the oldest request in flight, the head WR's.
func (q *QP) onResponse(c *peerConn, m *msg) {
	q.sq.mu.Lock()
	if q.sq.conn != c {
		q.sq.mu.Unlock()
		return
	}
	if c.skip > 0 { // the answer to a request abandoned by a rewind
		c.skip--
		q.kickLocked() // its request left room in the request ring
		q.sq.mu.Unlock()
		return
	}
	if q.sq.inflight == 0 || q.sq.n == 0 { // an answer to nothing asked
		c.fail(errMalformed)
		q.sq.mu.Unlock()
		return
	}
	q.sq.inflight--
	e := &q.sq.ring[q.sq.head]
	e.queried = false
	if m.respKind != respAck {
		q.abandonLocked() // the responder drops those behind the head, out of sequence
	} else if q.sq.inflight > 0 {
		if d := rc.ACKTimeout(q.sq.timeout); d > 0 {
			q.sq.deadline = time.Now().Add(d)
		}
	}
	switch m.respKind {
	case respAck:
		if e.op == verbs.OpRDMARead && e.length > 0 {
			q.finishReadLocked(e, c)
		} else {
			q.succeedLocked(e)
		}
	case respRNR:
		if q.sq.rnrRetry != 7 {
			if e.rnrLeft == 0 {
				q.completeLocked(e, verbs.WCRNRRetryExcErr)
				q.popSendLocked()
				break
			}
			e.rnrLeft--
		}
		q.sq.waiting = true
		q.timer.Reset(rc.RNRDelay(m.rnrTimer))
	case respDrop:
		c.forgetRegions() // the responder may have been reset and connected anew
		q.lostLocked(e, false)
	case respErr:
		c.forgetRegions()
		q.completeLocked(e, verbs.WCStatus(m.status))
		q.popSendLocked()
	}
	q.kickLocked()
	q.sq.mu.Unlock()
	if q.State() == verbs.QPStateError {
		q.flushRecv()
	}
}

// finishReadLocked copies the bytes of an acknowledged RDMA READ out of the peer's
// region into the local buffers.
func (q *QP) finishReadLocked(e *wqe, c *peerConn) {
	r := c.region(e.rkey)
	var src []byte
	ok := false
	if r != nil {
		src, ok = r.slice(e.raddr, e.length)
	}
	if !ok { // the responder granted what this side's copy of the region refuses
		q.completeLocked(e, verbs.WCRemOpErr)
		q.popSendLocked()
		return
	}
	q.dev.mrMu.RLock()
	if st := q.resolveLocalLocked(e); st != verbs.WCSuccess {
		q.dev.mrMu.RUnlock()
		q.completeLocked(e, st)
		q.popSendLocked()
		return
	}
	scatter(q.sq.vec, src)
	q.dev.mrMu.RUnlock()
	q.succeedLocked(e)
}

func (q *QP) succeedLocked(e *wqe) {
	q.sq.psn = (q.sq.psn + 1) & qpnMask
	if q.sigAll || e.flags&verbs.SendSignaled != 0 {
		q.completeLocked(e, verbs.WCSuccess)
	} else {
		q.sq.unreported++
	}
	q.popSendLocked()
}

// onConnDown handles the loss of the connection to the destination QP: the requests in
// flight are lost to a dead link, and so is a head request the responder dropped with
// an ACK timeout of 0 (lostLocked's forever), which no answer can end any more. (A
// destroyed QP answers with drops until its connections close: QP.Close.)
func (q *QP) onConnDown(c *peerConn) {
	q.sq.mu.Lock()
	if q.sq.conn == c && q.sq.n > 0 {
		head := &q.sq.ring[q.sq.head]
		if q.sq.busy() || head.forever {
			q.sq.inflight, q.sq.querying = 0, false
			head.forever = false
			q.lostLocked(head, true)
			q.kickLocked()
		}
	}
	q.sq.mu.Unlock()
	if q.State() == verbs.QPStateError {
		q.flushRecv()
	}
}

// completeLocked adds e's completion to the send CQ. Any error but a flush moves the QP
// to ERROR.
func (q *QP) completeLocked(e *wqe, status verbs.WCStatus) {
	wc := verbs.WorkCompletion{WRID: e.id, Status: status, Opcode: sendWCOpcode[e.op&7], QPN: q.qpn}
	switch status {
	case verbs.WCSuccess:
		wc.ByteLen = e.length
	case verbs.WCWRFlushErr:
	default:
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

// gather copies the buffers of src, in order, into dst.
func gather(dst []byte, src [][]byte) {
	for _, s := range src {
		dst = dst[copy(dst, s):]
	}
}

// scatter copies src into the buffers of dst, in order.
func scatter(dst [][]byte, src []byte) {
	for _, d := range dst {
		src = src[copy(d, src):]
	}
}
