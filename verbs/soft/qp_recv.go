package soft

import (
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// PostRecv posts receive requests. Receives may be posted from INIT on; in ERROR they are
// flushed at once.
func (q *QP) PostRecv(wrs []verbs.RecvWR) error {
	q.rq.mu.Lock()
	var err error
	for i := range wrs {
		if e := q.postRecvLocked(&wrs[i]); e != nil {
			err = &verbs.PostError{Index: i, Err: e}
			break
		}
	}
	q.rq.mu.Unlock()
	return err
}

func (q *QP) postRecvLocked(w *verbs.RecvWR) error {
	st := q.State()
	if err := postErrs.CheckPostRecv(st, q.closed.Load(), &q.caps, q.rq.wq.InUse(q.polled.RQ.Load()), w); err != nil {
		return err
	}
	q.rq.wq.Post(w)
	if st == verbs.QPStateError {
		q.flushRecvLocked()
	}
	return nil
}

// recvCompleteLocked completes the receive WQE at the head of the queue with wc.
func (q *QP) recvCompleteLocked(wc *verbs.WorkCompletion, solicited bool) {
	switch wc.Status {
	case verbs.WCSuccess:
	case verbs.WCWRFlushErr:
		q.dev.stats.flushed.Add(1)
	default:
		q.dev.stats.errors.Add(1)
	}
	q.rq.wq.Pop()
	if !q.recvCQ.push(wc, q, 0, 1, solicited) {
		q.fail()
	}
}

// acceptsLocked reports whether this QP, as responder, takes requests from requester r
// now: it must be ready to receive and connected back to r, the GID r sends from, with
// the PSN r sends next.
// Anything else is a request the responder drops, which the requester sees as a loss.
func (q *QP) acceptsLocked(r *QP) bool {
	if q.closed.Load() {
		return false
	}
	if st := q.State(); st != verbs.QPStateRTR && st != verbs.QPStateRTS {
		return false
	}
	return q.rq.srcDev == r.dev && q.rq.srcQPN == r.qpn && q.rq.epsn == r.sq.psn && q.rq.srcGID == r.sq.sgid
}

// respondLocked executes request e from requester r at this QP, the responder. The
// caller holds r.sq.mu and q.rq.mu; r.sq.vec holds the request's local buffers. It
// returns the status for the requester, or rnr when a receive WQE was needed and none was
// posted. Responder-side errors complete the receive WQE in error and move this QP to
// ERROR as well. A SEND's receive WQE must take the whole message into locally writable
// memory of this QP's PD (rc.ResolveRecv); an RDMA WRITE or READ must be allowed by the
// QP and by a region of its PD that its rkey names and that holds every byte
// (rc.CheckRemote). Both are called here rather than through methods of q, so that each
// check costs one call.
func (q *QP) respondLocked(r *QP, e *wqe) (status verbs.WCStatus, rnr bool) {
	n := e.length
	switch e.op {
	case verbs.OpSend, verbs.OpSendWithImm:
		if q.rq.wq.Len() == 0 {
			return 0, true
		}
		w := q.rq.wq.Head()
		vec, st := rc.ResolveRecv(&q.dev.mrs, &q.pd.refs, w.SGL, n, q.rq.vec[:0])
		if st != verbs.WCSuccess {
			q.responderFailLocked(w, st)
			if st == verbs.WCLocLenErr {
				return verbs.WCRemInvReqErr, false // "message too long" is an invalid request
			}
			return verbs.WCRemOpErr, false
		}
		q.rq.vec = vec
		copyVec(vec, r.sq.vec)
		wc := verbs.WorkCompletion{WRID: w.ID, Opcode: verbs.WCRecv, ByteLen: n, QPN: q.qpn, SrcQP: r.qpn}
		if e.op == verbs.OpSendWithImm {
			wc.Imm, wc.Flags = e.imm, verbs.WCWithImm
		}
		q.recvCompleteLocked(&wc, e.flags&verbs.SendSolicited != 0)

	case verbs.OpRDMAWrite, verbs.OpRDMAWriteWithImm:
		imm := e.op == verbs.OpRDMAWriteWithImm
		if imm && q.rq.wq.Len() == 0 {
			return 0, true
		}
		dst, ok := rc.CheckRemote(&q.dev.mrs, &q.pd.refs, q.rq.access, verbs.AccessRemoteWrite, e.rkey, e.raddr, n)
		if !ok {
			q.responderFailLocked(nil, 0)
			return verbs.WCRemAccessErr, false
		}
		gather(dst, r.sq.vec) // the payload lands before the receive completion exists
		if imm {
			w := q.rq.wq.Head()
			wc := verbs.WorkCompletion{WRID: w.ID, Opcode: verbs.WCRecvRDMAWithImm, ByteLen: n, Imm: e.imm,
				QPN: q.qpn, SrcQP: r.qpn, Flags: verbs.WCWithImm}
			q.recvCompleteLocked(&wc, e.flags&verbs.SendSolicited != 0)
		}

	case verbs.OpRDMARead:
		src, ok := rc.CheckRemote(&q.dev.mrs, &q.pd.refs, q.rq.access, verbs.AccessRemoteRead, e.rkey, e.raddr, n)
		if !ok {
			q.responderFailLocked(nil, 0)
			return verbs.WCRemAccessErr, false
		}
		scatter(r.sq.vec, src)
	}
	q.rq.epsn = (q.rq.epsn + packets(n, q.rq.mtu)) & psnMask
	return verbs.WCSuccess, false
}

// responderFailLocked handles a fatal responder error: receive WQE w, if not nil, completes
// with status, the QP moves to ERROR and its remaining receive WQEs are flushed; its send
// queue is flushed by its timer.
func (q *QP) responderFailLocked(w *rc.RecvWQE, status verbs.WCStatus) {
	q.fail()
	if w != nil {
		q.recvCompleteLocked(&verbs.WorkCompletion{WRID: w.ID, Status: status, Opcode: verbs.WCRecv, QPN: q.qpn}, true)
	}
	q.flushRecvLocked()
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

// copyVec copies the buffers of src, in order, into the buffers of dst, which hold at
// least as many bytes.
func copyVec(dst, src [][]byte) {
	di, off := 0, 0
	for _, s := range src {
		for len(s) > 0 && di < len(dst) {
			n := copy(dst[di][off:], s)
			s, off = s[n:], off+n
			if off == len(dst[di]) {
				di, off = di+1, 0
			}
		}
	}
}
