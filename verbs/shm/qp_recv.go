package shm

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
	q.rq.wq.Pop()
	if !q.recvCQ.push(wc, q, 0, 1, solicited) {
		q.fail()
	}
}

// requester names the QP at the other end of a connection, as its hello introduced it.
type requester struct {
	gid verbs.GID
	qpn uint32
}

// respond executes request m from requester src at this QP, the responder, and returns
// the response to send. An RDMA WRITE's payload is already in place: the requester
// copied it into its mapping of the region, if its copy of the region's rights allowed.
// The checks here are the ones that count: a request they refuse completes in error
// (and moves both QPs to ERROR) whatever the requester copied.
func (q *QP) respond(src requester, m *msg) msg {
	drop := msg{kind: msgResponse, respKind: respDrop}
	q.rq.mu.Lock()
	defer q.rq.mu.Unlock()
	if q.closed.Load() {
		return drop
	}
	if st := q.State(); st != verbs.QPStateRTR && st != verbs.QPStateRTS {
		return drop
	}
	if q.rq.srcGID != src.gid || q.rq.srcQPN != src.qpn || q.loses() {
		return drop
	}
	if m.psn != q.rq.epsn {
		// A retransmission of a request executed already, whose answer came too late,
		// is acknowledged again (within a window behind the expected PSN, as a
		// responder keeps); anything else is out of sequence and dropped.
		if behind := (q.rq.epsn - m.psn) & qpnMask; behind > 0 && behind < 1<<23 {
			return msg{kind: msgResponse, respKind: respAck}
		}
		return drop
	}
	return q.executeLocked(src, m)
}

// executeLocked executes request m, in sequence and from the QP's peer src, and
// returns its response. Called with rq.mu held. (respond and executeLocked are two
// functions so that each has one defer, open-coded: in one, the compiler put both on
// the stack, two runtime calls for every request.)
func (q *QP) executeLocked(src requester, m *msg) msg {
	q.dev.mrMu.RLock()
	defer q.dev.mrMu.RUnlock()
	n := m.length
	solicited := m.flags&reqSolicited != 0
	switch m.op {
	case opSend, opSendWithImm:
		if q.rq.wq.Len() == 0 {
			return msg{kind: msgResponse, respKind: respRNR, rnrTimer: q.rq.minRNR}
		}
		w := q.rq.wq.Head()
		if st := q.resolveRecvLocked(w, n); st != verbs.WCSuccess {
			q.responderFailLocked(w, st)
			if st == verbs.WCLocLenErr {
				return errResponse(verbs.WCRemInvReqErr)
			}
			return errResponse(verbs.WCRemOpErr)
		}
		scatter(q.rq.vec, m.payload)
		wc := verbs.WorkCompletion{WRID: w.ID, Opcode: verbs.WCRecv, ByteLen: n, QPN: q.qpn, SrcQP: src.qpn}
		if m.op == opSendWithImm {
			wc.Imm, wc.Flags = m.imm, verbs.WCWithImm
		}
		q.recvCompleteLocked(&wc, solicited)
	case opWrite, opWriteWithImm:
		imm := m.op == opWriteWithImm
		if imm && q.rq.wq.Len() == 0 {
			return msg{kind: msgResponse, respKind: respRNR, rnrTimer: q.rq.minRNR}
		}
		if !q.remoteOKLocked(m, verbs.AccessRemoteWrite) {
			q.responderFailLocked(nil, 0)
			return errResponse(verbs.WCRemAccessErr)
		}
		if imm {
			w := q.rq.wq.Head()
			wc := verbs.WorkCompletion{WRID: w.ID, Opcode: verbs.WCRecvRDMAWithImm, ByteLen: n, Imm: m.imm,
				QPN: q.qpn, SrcQP: src.qpn, Flags: verbs.WCWithImm}
			q.recvCompleteLocked(&wc, solicited)
		}
	case opRead:
		if !q.remoteOKLocked(m, verbs.AccessRemoteRead) {
			q.responderFailLocked(nil, 0)
			return errResponse(verbs.WCRemAccessErr)
		}
	}
	q.rq.epsn = (q.rq.epsn + 1) & qpnMask
	return msg{kind: msgResponse, respKind: respAck}
}

func errResponse(st verbs.WCStatus) msg {
	return msg{kind: msgResponse, respKind: respErr, status: uint32(st)}
}

// remoteOKLocked checks a remote access of m.length bytes at m.addr with m.rkey: the QP
// must allow it, and the key must name a region of this QP's PD that allows it and holds
// every byte. A zero-length access checks neither key nor address.
func (q *QP) remoteOKLocked(m *msg, need verbs.AccessFlags) bool {
	_, ok := rc.CheckRemote(&q.dev.mrs, &q.pd.refs, q.rq.access, need, m.rkey, m.addr, m.length)
	return ok
}

// resolveRecvLocked checks that receive WQE w can take n bytes and resolves its buffers
// into q.rq.vec.
func (q *QP) resolveRecvLocked(w *rc.RecvWQE, n uint32) verbs.WCStatus {
	vec, st := rc.ResolveRecv(&q.dev.mrs, &q.pd.refs, w.SGL, n, q.rq.vec[:0])
	if st == verbs.WCSuccess {
		q.rq.vec = vec
	}
	return st
}

// responderFailLocked handles a fatal responder error: receive WQE w, if not nil,
// completes with status, the QP moves to ERROR and its receive WQEs are flushed.
func (q *QP) responderFailLocked(w *rc.RecvWQE, status verbs.WCStatus) {
	q.fail()
	if w != nil {
		q.recvCompleteLocked(&verbs.WorkCompletion{WRID: w.ID, Status: status, Opcode: verbs.WCRecv, QPN: q.qpn}, true)
	}
	q.flushRecvLocked()
}

// regionFor answers a region query of requester src: the region rkey names, if it
// belongs to this QP's PD and grants a remote access and src is the QP's peer, with a
// new descriptor of it for the requester (see [MR.shareFD]), or a refusal and -1.
func (q *QP) regionFor(src requester, rkey uint32) (msg, int) {
	no := msg{kind: msgRegion, rkey: rkey}
	q.rq.mu.Lock()
	ok := !q.closed.Load() && q.rq.srcGID == src.gid && q.rq.srcQPN == src.qpn
	qpAccess := q.rq.access
	q.rq.mu.Unlock()
	if !ok {
		return no, -1
	}
	q.dev.mrMu.RLock()
	defer q.dev.mrMu.RUnlock()
	m := q.dev.lookupMRLocked(rkey)
	if m == nil || m.pd != q.pd || m.reg.Access&(verbs.AccessRemoteWrite|verbs.AccessRemoteRead) == 0 {
		return no, -1
	}
	fd, err := m.shareFD()
	if err != nil {
		return no, -1
	}
	// The requester copies into the region only what both the region and the QP allow.
	return msg{kind: msgRegion, ok: true, rkey: rkey, access: uint32(m.reg.Access & (qpAccess | verbs.AccessLocalWrite)), addr: m.reg.Addr, size: uint64(len(m.reg.Buf))}, fd
}
