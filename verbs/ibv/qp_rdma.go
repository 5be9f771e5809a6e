//go:build rdma && linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/verbs"
)

// postBatch bounds the work requests one ibv_post_send or ibv_post_recv call takes;
// it sizes each QP's C-side scratch arrays. Longer slices are posted in batches.
const postBatch = 64

// defaultHopLimit is the GRH hop limit (the IP TTL with RoCE v2) used when an
// AddressVector leaves HopLimit 0, which no packet could be sent with.
const defaultHopLimit = 64

// CreateQP creates an RC QP in RESET, with C-side arrays for posting allocated once.
func (p *pd) CreateQP(attr verbs.QPInitAttr) (verbs.QP, error) {
	scq, ok1 := attr.SendCQ.(*cq)
	rcq, ok2 := attr.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.ctx != p.ctx || rcq.ctx != p.ctx {
		return nil, fmt.Errorf("ibv: create qp: send and receive CQs must be CQs of the same device: %w", verbs.ErrInvalidArgument)
	}
	c := attr.Caps
	if c.MaxSendWR < 0 || c.MaxRecvWR < 0 || c.MaxSendSGE < 0 || c.MaxRecvSGE < 0 || c.MaxInlineData < 0 {
		return nil, fmt.Errorf("ibv: create qp: negative capacity in %+v: %w", c, verbs.ErrInvalidArgument)
	}
	if err := p.acquire("create qp"); err != nil {
		return nil, err
	}
	defer p.release()
	// The CQs must stay alive while the QP is created.
	if err := scq.acquire(); err != nil {
		return nil, fmt.Errorf("ibv: create qp: send %w", err)
	}
	defer scq.release()
	if err := rcq.acquire(); err != nil {
		return nil, fmt.Errorf("ibv: create qp: receive %w", err)
	}
	defer rcq.release()

	var ia C.struct_ibv_qp_init_attr
	ia.qp_context = nil // C keeps no pointer to Go
	ia.send_cq = scq.c.cq
	ia.recv_cq = rcq.c.cq
	ia.srq = nil
	ia.cap.max_send_wr = C.uint32_t(c.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(c.MaxSendSGE)
	ia.cap.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(c.MaxInlineData)
	ia.qp_type = C.IBV_QPT_RC
	if attr.SignalAll {
		ia.sq_sig_all = 1
	}
	if err := vma.Reserve(qpMappings); err != nil {
		return nil, fmt.Errorf("ibv: create qp: %w", err)
	}
	ibqp, err := C.rsock_create_qp(p.pd, &ia)
	if ibqp == nil {
		vma.Release(qpMappings)
		return nil, errnoError("create qp", err, classCreate)
	}
	// ibv_create_qp(3) wrote the capacities it granted (>= those asked for) into ia.cap.
	granted := verbs.QPCaps{
		MaxSendWR:     int(ia.cap.max_send_wr),
		MaxRecvWR:     int(ia.cap.max_recv_wr),
		MaxSendSGE:    int(ia.cap.max_send_sge),
		MaxRecvSGE:    int(ia.cap.max_recv_sge),
		MaxInlineData: int(ia.cap.max_inline_data),
	}
	q := &qp{pd: p, ctx: p.ctx, qp: ibqp, key: uintptr(unsafe.Pointer(ibqp)), qpn: uint32(C.rsock_qp_num(ibqp)), caps: granted}
	if !q.allocQueues() {
		q.freeQueues()
		C.rsock_destroy_qp(ibqp)
		vma.Release(qpMappings)
		return nil, fmt.Errorf("ibv: create qp: %w", verbs.ErrNoResources)
	}
	p.ctx.registerQP(q)
	return q, nil
}

// qp implements verbs.QP over an ibv_qp of type IBV_QPT_RC.
type qp struct {
	pd   *pd
	ctx  *devContext
	qp   *C.struct_ibv_qp
	key  uintptr // address of the ibv_qp, the registry key
	qpn  uint32
	caps verbs.QPCaps // as granted by ibv_create_qp

	// state caches the QP state: set by the transitions here, and to ERROR by the
	// async event reader. It lets posts reject a QP that is not ready without a
	// syscall; State asks the device.
	state atomic.Int32

	// Lock order: modifyMu, then sendMu, then recvMu.
	modifyMu sync.Mutex // transitions, State and Close
	closed   atomic.Bool

	sendMu sync.Mutex // the send-side scratch arrays below
	sq     *C.struct_rsock_sq
	sqFlat []C.struct_rsock_send // C memory
	sqSGE  []C.struct_ibv_sge    // C memory, sq.max_sge per request
	recvMu sync.Mutex            // the receive-side scratch arrays below
	rq     *C.struct_rsock_rq
	rqWR   []C.struct_ibv_recv_wr // C memory
	rqSGE  []C.struct_ibv_sge     // C memory, rq.max_sge per request
}

// allocQueues allocates the C-side posting arrays: postBatch requests (fewer if the
// queue is smaller), each with room for the granted number of SGEs.
func (q *qp) allocQueues() bool {
	sendWR := min(max(q.caps.MaxSendWR, 1), postBatch)
	sendSGE := max(q.caps.MaxSendSGE, 1)
	recvWR := min(max(q.caps.MaxRecvWR, 1), postBatch)
	recvSGE := max(q.caps.MaxRecvSGE, 1)

	q.sq = (*C.struct_rsock_sq)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_rsock_sq{}))))
	q.rq = (*C.struct_rsock_rq)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_rsock_rq{}))))
	if q.sq == nil || q.rq == nil {
		return false
	}
	q.sq.qp, q.sq.max_wr, q.sq.max_sge = q.qp, C.int(sendWR), C.int(sendSGE)
	q.sq.flat = (*C.struct_rsock_send)(C.calloc(C.size_t(sendWR), C.size_t(unsafe.Sizeof(C.struct_rsock_send{}))))
	q.sq.wrs = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(sendWR), C.size_t(unsafe.Sizeof(C.struct_ibv_send_wr{}))))
	q.sq.sges = (*C.struct_ibv_sge)(C.calloc(C.size_t(sendWR*sendSGE), C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))))
	q.rq.qp, q.rq.max_wr, q.rq.max_sge = q.qp, C.int(recvWR), C.int(recvSGE)
	q.rq.wrs = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(recvWR), C.size_t(unsafe.Sizeof(C.struct_ibv_recv_wr{}))))
	q.rq.sges = (*C.struct_ibv_sge)(C.calloc(C.size_t(recvWR*recvSGE), C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))))
	if q.sq.flat == nil || q.sq.wrs == nil || q.sq.sges == nil || q.rq.wrs == nil || q.rq.sges == nil {
		return false
	}
	q.sqFlat = unsafe.Slice(q.sq.flat, sendWR)
	q.sqSGE = unsafe.Slice(q.sq.sges, sendWR*sendSGE)
	q.rqWR = unsafe.Slice(q.rq.wrs, recvWR)
	q.rqSGE = unsafe.Slice(q.rq.sges, recvWR*recvSGE)
	return true
}

func (q *qp) freeQueues() {
	if q.sq != nil {
		C.free(unsafe.Pointer(q.sq.flat))
		C.free(unsafe.Pointer(q.sq.wrs))
		C.free(unsafe.Pointer(q.sq.sges))
		C.free(unsafe.Pointer(q.sq))
	}
	if q.rq != nil {
		C.free(unsafe.Pointer(q.rq.wrs))
		C.free(unsafe.Pointer(q.rq.sges))
		C.free(unsafe.Pointer(q.rq))
	}
	q.sq, q.rq = nil, nil
	q.sqFlat, q.sqSGE, q.rqWR, q.rqSGE = nil, nil, nil, nil
}

func (q *qp) QPN() uint32 { return q.qpn }

// Caps returns the capacities ibv_create_qp granted, which may exceed those asked for
// (verbstest.CapsReporter).
func (q *qp) Caps() verbs.QPCaps { return q.caps }

// State asks the device for the QP's state (ibv_query_qp), so that it also shows
// transitions the device made on its own, such as to ERROR. After Close, or if the
// query fails, it returns the last state known.
func (q *qp) State() verbs.QPState {
	q.modifyMu.Lock()
	defer q.modifyMu.Unlock()
	if !q.closed.Load() {
		if s := C.rsock_query_qp_state(q.qp); s >= 0 && s <= C.IBV_QPS_ERR {
			q.state.Store(int32(s))
		}
	}
	return verbs.QPState(q.state.Load())
}

// Query reports the QP's state, path MTU, destination QPN and address vector as the
// device holds them (ibv_query_qp), traffic class and SL included. It implements
// verbs.QPQuerier.
func (q *qp) Query() (verbs.QPAttr, error) {
	q.modifyMu.Lock()
	defer q.modifyMu.Unlock()
	if q.closed.Load() {
		return verbs.QPAttr{}, fmt.Errorf("ibv: query qp %#x: queue pair %w", q.qpn, verbs.ErrClosed)
	}
	var a C.struct_ibv_qp_attr
	if rc := C.rsock_query_qp(q.qp, &a); rc != 0 {
		return verbs.QPAttr{}, errnoError(fmt.Sprintf("query qp %#x", q.qpn), syscall.Errno(rc), classOther)
	}
	ah := &a.ah_attr
	return verbs.QPAttr{
		State:   verbs.QPState(a.qp_state),
		PathMTU: verbs.MTU(a.path_mtu),
		DestQPN: uint32(a.dest_qp_num),
		Dest: verbs.AddressVector{
			LID:          uint16(ah.dlid),
			Port:         uint8(ah.port_num),
			IsGlobal:     ah.is_global != 0,
			DestGID:      *(*[16]byte)(unsafe.Pointer(&ah.grh.dgid)),
			SGIDIndex:    uint8(ah.grh.sgid_index),
			HopLimit:     uint8(ah.grh.hop_limit),
			TrafficClass: uint8(ah.grh.traffic_class),
			SL:           uint8(ah.sl),
		},
	}, nil
}

var _ verbs.QPQuerier = (*qp)(nil)

// ToInit moves the QP from RESET to INIT. The attribute mask is the one
// ibv_modify_qp(3) requires for RC: STATE | PKEY_INDEX | PORT | ACCESS_FLAGS.
func (q *qp) ToInit(attr verbs.InitAttr) error {
	if attr.Access&^validAccess != 0 {
		return fmt.Errorf("ibv: modify qp %#x to INIT: access flags %#x: %w", q.qpn, uint32(attr.Access), verbs.ErrInvalidArgument)
	}
	if attr.Port == 0 {
		return fmt.Errorf("ibv: modify qp %#x to INIT: port 0: %w", q.qpn, verbs.ErrInvalidArgument)
	}
	var a C.struct_ibv_qp_attr
	a.qp_state = C.IBV_QPS_INIT
	a.pkey_index = C.uint16_t(attr.PKeyIndex)
	a.port_num = C.uint8_t(attr.Port)
	a.qp_access_flags = C.uint(attr.Access)
	return q.modify(&a, C.IBV_QP_STATE|C.IBV_QP_PKEY_INDEX|C.IBV_QP_PORT|C.IBV_QP_ACCESS_FLAGS,
		verbs.QPStateReset, verbs.QPStateInit)
}

// ToRTR moves the QP from INIT to RTR. Mask: STATE | AV | PATH_MTU | DEST_QPN |
// RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER.
func (q *qp) ToRTR(attr verbs.RTRAttr) error {
	switch {
	case attr.PathMTU < verbs.MTU256 || attr.PathMTU > verbs.MTU4096:
		return fmt.Errorf("ibv: modify qp %#x to RTR: path MTU %d: %w", q.qpn, int(attr.PathMTU), verbs.ErrInvalidArgument)
	case attr.DestQPN > 0xffffff:
		return fmt.Errorf("ibv: modify qp %#x to RTR: destination QPN %#x is not 24 bits: %w", q.qpn, attr.DestQPN, verbs.ErrInvalidArgument)
	case attr.RQPSN > 0xffffff:
		return fmt.Errorf("ibv: modify qp %#x to RTR: receive PSN %#x is not 24 bits: %w", q.qpn, attr.RQPSN, verbs.ErrInvalidArgument)
	case attr.MinRNRTimer > 31:
		return fmt.Errorf("ibv: modify qp %#x to RTR: min RNR timer %d is not 5 bits: %w", q.qpn, attr.MinRNRTimer, verbs.ErrInvalidArgument)
	}
	var a C.struct_ibv_qp_attr
	a.qp_state = C.IBV_QPS_RTR
	a.path_mtu = C.enum_ibv_mtu(attr.PathMTU)
	a.dest_qp_num = C.uint32_t(attr.DestQPN)
	a.rq_psn = C.uint32_t(attr.RQPSN)
	a.max_dest_rd_atomic = C.uint8_t(attr.MaxDestRdAtomic)
	a.min_rnr_timer = C.uint8_t(attr.MinRNRTimer)
	setAH(&a.ah_attr, attr.Dest)
	return q.modify(&a, C.IBV_QP_STATE|C.IBV_QP_AV|C.IBV_QP_PATH_MTU|C.IBV_QP_DEST_QPN|
		C.IBV_QP_RQ_PSN|C.IBV_QP_MAX_DEST_RD_ATOMIC|C.IBV_QP_MIN_RNR_TIMER,
		verbs.QPStateInit, verbs.QPStateRTR)
}

// setAH fills an ibv_ah_attr (ibv_create_ah(3)) from an AddressVector. With IsGlobal
// (required for RoCE) the GRH carries the destination GID, the source GID index, the
// hop limit and the traffic class; the SL is set in either case. Flow label, source
// path bits and static rate stay 0.
func setAH(ah *C.struct_ibv_ah_attr, av verbs.AddressVector) {
	ah.dlid = C.uint16_t(av.LID)
	ah.sl = C.uint8_t(av.SL)
	ah.src_path_bits = 0
	ah.static_rate = 0
	ah.port_num = C.uint8_t(av.Port)
	if !av.IsGlobal {
		return
	}
	ah.is_global = 1
	// union ibv_gid is 16 raw bytes, in network order like verbs.GID.
	*(*[16]byte)(unsafe.Pointer(&ah.grh.dgid)) = av.DestGID
	ah.grh.sgid_index = C.uint8_t(av.SGIDIndex)
	ah.grh.traffic_class = C.uint8_t(av.TrafficClass)
	ah.grh.hop_limit = C.uint8_t(av.HopLimit)
	if av.HopLimit == 0 {
		ah.grh.hop_limit = defaultHopLimit
	}
}

// ToRTS moves the QP from RTR to RTS. Mask: STATE | TIMEOUT | RETRY_CNT | RNR_RETRY |
// SQ_PSN | MAX_QP_RD_ATOMIC.
func (q *qp) ToRTS(attr verbs.RTSAttr) error {
	switch {
	case attr.SQPSN > 0xffffff:
		return fmt.Errorf("ibv: modify qp %#x to RTS: send PSN %#x is not 24 bits: %w", q.qpn, attr.SQPSN, verbs.ErrInvalidArgument)
	case attr.Timeout > 31:
		return fmt.Errorf("ibv: modify qp %#x to RTS: timeout %d is not 5 bits: %w", q.qpn, attr.Timeout, verbs.ErrInvalidArgument)
	case attr.RetryCount > 7 || attr.RNRRetry > 7:
		return fmt.Errorf("ibv: modify qp %#x to RTS: retry counts %d, %d are not 3 bits: %w", q.qpn, attr.RetryCount, attr.RNRRetry, verbs.ErrInvalidArgument)
	}
	var a C.struct_ibv_qp_attr
	a.qp_state = C.IBV_QPS_RTS
	a.timeout = C.uint8_t(attr.Timeout)
	a.retry_cnt = C.uint8_t(attr.RetryCount)
	a.rnr_retry = C.uint8_t(attr.RNRRetry)
	a.sq_psn = C.uint32_t(attr.SQPSN)
	a.max_rd_atomic = C.uint8_t(attr.MaxRdAtomic)
	return q.modify(&a, C.IBV_QP_STATE|C.IBV_QP_TIMEOUT|C.IBV_QP_RETRY_CNT|C.IBV_QP_RNR_RETRY|
		C.IBV_QP_SQ_PSN|C.IBV_QP_MAX_QP_RD_ATOMIC,
		verbs.QPStateRTR, verbs.QPStateRTS)
}

// ToError moves the QP to ERROR from any state; outstanding requests are flushed.
func (q *qp) ToError() error {
	var a C.struct_ibv_qp_attr
	a.qp_state = C.IBV_QPS_ERR
	return q.modify(&a, C.IBV_QP_STATE, anyState, verbs.QPStateError)
}

// ToReset moves the QP to RESET from any state.
func (q *qp) ToReset() error {
	var a C.struct_ibv_qp_attr
	a.qp_state = C.IBV_QPS_RESET
	return q.modify(&a, C.IBV_QP_STATE, anyState, verbs.QPStateReset)
}

const anyState verbs.QPState = -1

// modify runs ibv_modify_qp for the transition from → to. A QP known not to be in
// from fails with ErrInvalidState before the device is asked.
func (q *qp) modify(a *C.struct_ibv_qp_attr, mask C.int, from, to verbs.QPState) error {
	q.modifyMu.Lock()
	defer q.modifyMu.Unlock()
	if q.closed.Load() {
		return fmt.Errorf("ibv: modify qp %#x to %v: queue pair %w", q.qpn, to, verbs.ErrClosed)
	}
	if cur := verbs.QPState(q.state.Load()); from != anyState && cur != from {
		return fmt.Errorf("ibv: modify qp %#x to %v: QP is %v, not %v: %w", q.qpn, to, cur, from, verbs.ErrInvalidState)
	}
	if rc, err := C.rsock_modify_qp(q.qp, a, mask); rc != 0 {
		return errnoError(fmt.Sprintf("modify qp %#x to %v", q.qpn, to), errnoOf(int(rc), err), classModify)
	}
	q.state.Store(int32(to))
	return nil
}

// Close destroys the QP and frees its posting arrays.
func (q *qp) Close() error {
	q.modifyMu.Lock()
	defer q.modifyMu.Unlock()
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	if q.closed.Load() {
		return fmt.Errorf("ibv: destroy qp %#x: %w", q.qpn, verbs.ErrClosed)
	}
	if rc, err := C.rsock_destroy_qp(q.qp); rc != 0 {
		return errnoError(fmt.Sprintf("destroy qp %#x", q.qpn), errnoOf(int(rc), err), classDestroy)
	}
	q.closed.Store(true)
	q.ctx.unregisterQP(q.key, q)
	q.freeQueues()
	vma.Release(qpMappings)
	return nil
}
