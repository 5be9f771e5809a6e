//go:build rdma && linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"syscall"

	"github.com/rsockio/rsock/verbs"
)

// The post path copies the caller's work requests into the QP's C-side arrays
// (allocated once at CreateQP) and makes one cgo call per batch of up to postBatch
// requests. It allocates nothing unless it fails.

var (
	errPostClosed   = fmt.Errorf("ibv: post: queue pair %w", verbs.ErrClosed)
	errSendNotReady = fmt.Errorf("ibv: post send: QP is not ready to send (RTS): %w", verbs.ErrInvalidState)
	errRecvReset    = fmt.Errorf("ibv: post recv: QP is in RESET: %w", verbs.ErrInvalidState)
)

const validSendFlags = verbs.SendFence | verbs.SendSignaled | verbs.SendSolicited | verbs.SendInline

// PostSend posts wr in order. A request the QP cannot take (bad opcode or flags, too
// many SGEs, inline data too long) is rejected before the device sees it, after the
// requests before it are posted. Requests posted to a QP in ERROR complete with
// WR_FLUSH_ERR (see flushPosted).
func (q *qp) PostSend(wr []verbs.SendWR) error {
	err := q.postSend(wr)
	q.flushPosted()
	return err
}

// PostRecv posts wr in order, with the failure rule of PostSend; receives may be posted
// from INIT on.
func (q *qp) PostRecv(wr []verbs.RecvWR) error {
	err := q.postRecv(wr)
	q.flushPosted()
	return err
}

// flushPosted makes sure that requests posted to a QP this provider moved to ERROR are
// flushed, as the verbs contract says (IBA C10-42): it moves the QP to ERROR again, a
// transition every driver accepts and answers by flushing its queues. rxe needs it: it
// flushes a QP's queues when the QP enters ERROR, and on kernel 6.1 never again, so later
// requests never complete; on 6.12 whether they do depends on whether its completer task
// is still running when they are posted. Called without the post locks held (ToError
// takes modifyMu, and Close takes modifyMu before them). The cost outside ERROR is one
// atomic load.
func (q *qp) flushPosted() {
	if verbs.QPState(q.state.Load()) == verbs.QPStateError && !q.closed.Load() {
		q.ToError() // a QP closed meanwhile has nothing to flush
	}
}

func (q *qp) postSend(wr []verbs.SendWR) error {
	if len(wr) == 0 {
		return nil
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	if q.closed.Load() {
		return &verbs.PostError{Index: 0, Err: errPostClosed}
	}
	switch verbs.QPState(q.state.Load()) {
	case verbs.QPStateReset, verbs.QPStateInit, verbs.QPStateRTR:
		return &verbs.PostError{Index: 0, Err: errSendNotReady}
	}
	for base := 0; base < len(wr); {
		n, bad := q.fillSend(wr[base:])
		if n > 0 {
			if rc := C.rsock_post_send(q.sq, C.int(n)); rc != 0 {
				return &verbs.PostError{Index: base + int(q.sq.bad), Err: errnoError("post send", syscall.Errno(rc), classPost)}
			}
		}
		if bad != nil {
			return &verbs.PostError{Index: base + n, Err: bad}
		}
		base += n
	}
	return nil
}

// fillSend writes up to one batch of wr into the C arrays. It returns how many it
// wrote, and why wr[n] cannot be posted if it stopped at an invalid request.
func (q *qp) fillSend(wr []verbs.SendWR) (int, error) {
	maxSGE := int(q.sq.max_sge)
	n := min(len(wr), len(q.sqFlat))
	for i := range n {
		w := &wr[i]
		if err := q.checkSend(w); err != nil {
			return i, err
		}
		f := &q.sqFlat[i]
		f.wr_id = C.uint64_t(w.ID)
		f.remote_addr = C.uint64_t(w.RemoteAddr)
		f.rkey = C.uint32_t(w.RKey)
		f.imm = C.uint32_t(w.Imm) // host order; rsock_post_send applies htonl
		f.opcode = C.uint32_t(w.Opcode)
		f.send_flags = C.uint32_t(w.Flags)
		f.num_sge = C.uint32_t(len(w.SGL))
		sges := q.sqSGE[i*maxSGE : i*maxSGE+len(w.SGL)]
		for j, s := range w.SGL {
			sges[j].addr = C.uint64_t(s.Addr)
			sges[j].length = C.uint32_t(s.Length)
			sges[j].lkey = C.uint32_t(s.LKey)
		}
	}
	return n, nil
}

func (q *qp) checkSend(w *verbs.SendWR) error {
	if w.Opcode < verbs.OpRDMAWrite || w.Opcode > verbs.OpRDMARead {
		return fmt.Errorf("ibv: post send: opcode %v: %w", w.Opcode, verbs.ErrInvalidArgument)
	}
	if w.Flags&^validSendFlags != 0 {
		return fmt.Errorf("ibv: post send: flags %#x: %w", uint32(w.Flags), verbs.ErrInvalidArgument)
	}
	if len(w.SGL) > int(q.sq.max_sge) || len(w.SGL) > q.caps.MaxSendSGE {
		return fmt.Errorf("ibv: post send: %d SGEs, the QP takes %d: %w", len(w.SGL), q.caps.MaxSendSGE, verbs.ErrInvalidArgument)
	}
	if w.Flags&verbs.SendInline != 0 {
		// ibv_post_send(3): inline is valid only for SEND and RDMA WRITE.
		if w.Opcode == verbs.OpRDMARead {
			return fmt.Errorf("ibv: post send: inline RDMA READ: %w", verbs.ErrInvalidArgument)
		}
		total := 0
		for _, s := range w.SGL {
			total += int(s.Length)
		}
		if total > q.caps.MaxInlineData {
			return fmt.Errorf("ibv: post send: %d bytes inline, the QP takes %d: %w", total, q.caps.MaxInlineData, verbs.ErrInvalidArgument)
		}
	}
	return nil
}

func (q *qp) postRecv(wr []verbs.RecvWR) error {
	if len(wr) == 0 {
		return nil
	}
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	if q.closed.Load() {
		return &verbs.PostError{Index: 0, Err: errPostClosed}
	}
	if verbs.QPState(q.state.Load()) == verbs.QPStateReset {
		return &verbs.PostError{Index: 0, Err: errRecvReset}
	}
	maxSGE := int(q.rq.max_sge)
	for base := 0; base < len(wr); {
		batch := wr[base:min(len(wr), base+len(q.rqWR))]
		n := 0
		var bad error
		for i := range batch {
			w := &batch[i]
			if len(w.SGL) > maxSGE || len(w.SGL) > q.caps.MaxRecvSGE {
				bad = fmt.Errorf("ibv: post recv: %d SGEs, the QP takes %d: %w", len(w.SGL), q.caps.MaxRecvSGE, verbs.ErrInvalidArgument)
				break
			}
			r := &q.rqWR[i]
			r.wr_id = C.uint64_t(w.ID)
			r.num_sge = C.int(len(w.SGL))
			sges := q.rqSGE[i*maxSGE : i*maxSGE+len(w.SGL)]
			for j, s := range w.SGL {
				sges[j].addr = C.uint64_t(s.Addr)
				sges[j].length = C.uint32_t(s.Length)
				sges[j].lkey = C.uint32_t(s.LKey)
			}
			n++
		}
		if n > 0 {
			if rc := C.rsock_post_recv(q.rq, C.int(n)); rc != 0 {
				return &verbs.PostError{Index: base + int(q.rq.bad), Err: errnoError("post recv", syscall.Errno(rc), classPost)}
			}
		}
		if bad != nil {
			return &verbs.PostError{Index: base + n, Err: bad}
		}
		base += n
	}
	return nil
}
