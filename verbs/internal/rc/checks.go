package rc

import (
	"fmt"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// PSNMask keeps the 24 bits of a PSN or a QP number.
const PSNMask = 1<<24 - 1

// Limits are the device capacities that the QP and CQ checks hold requests to.
type Limits struct {
	MaxQPWR   int       // MaxSendWR and MaxRecvWR
	MaxSGE    int       // MaxSendSGE and MaxRecvSGE
	MaxInline int       // MaxInlineData
	MaxCQE    int       // entries of one CQ
	MaxMTU    verbs.MTU // path MTU of an RTR transition
	Vectors   int       // completion vectors
}

// CheckCreateCQ checks the arguments of ibv_create_cq: cqe entries on completion vector
// vector. The error wraps [verbs.ErrInvalidArgument].
func (p *Provider) CheckCreateCQ(l *Limits, cqe, vector int) error {
	if cqe < 1 || cqe > l.MaxCQE {
		return fmt.Errorf("%s: create CQ of %d entries (device max %d): %w", p.name, cqe, l.MaxCQE, verbs.ErrInvalidArgument)
	}
	if vector < 0 || vector >= l.Vectors {
		return fmt.Errorf("%s: create CQ on completion vector %d of %d: %w", p.name, vector, l.Vectors, verbs.ErrInvalidArgument)
	}
	return nil
}

// CheckQPCaps checks the capacities ibv_create_qp is asked for. The error wraps
// [verbs.ErrInvalidArgument].
func (p *Provider) CheckQPCaps(l *Limits, c verbs.QPCaps) error {
	switch {
	case c.MaxSendWR < 1 || c.MaxSendWR > l.MaxQPWR || c.MaxRecvWR < 0 || c.MaxRecvWR > l.MaxQPWR:
		return fmt.Errorf("%s: create QP with %d send and %d receive WRs (device max %d): %w", p.name, c.MaxSendWR, c.MaxRecvWR, l.MaxQPWR, verbs.ErrInvalidArgument)
	case c.MaxSendSGE < 0 || c.MaxSendSGE > l.MaxSGE || c.MaxRecvSGE < 0 || c.MaxRecvSGE > l.MaxSGE:
		return fmt.Errorf("%s: create QP with %d send and %d receive SGEs (device max %d): %w", p.name, c.MaxSendSGE, c.MaxRecvSGE, l.MaxSGE, verbs.ErrInvalidArgument)
	case c.MaxInlineData < 0 || c.MaxInlineData > l.MaxInline:
		return fmt.Errorf("%s: create QP with %d bytes inline (device max %d): %w", p.name, c.MaxInlineData, l.MaxInline, verbs.ErrInvalidArgument)
	}
	return nil
}

// CheckInit checks the attributes of QP qpn's RESET → INIT transition: the devices have
// one port (1) with one partition key (index 0). The error wraps
// [verbs.ErrInvalidArgument].
func (p *Provider) CheckInit(qpn uint32, attr *verbs.InitAttr) error {
	switch {
	case attr.Port != 1:
		return fmt.Errorf("%s: QP %#x: to INIT: no port %d: %w", p.name, qpn, attr.Port, verbs.ErrInvalidArgument)
	case attr.PKeyIndex != 0:
		return fmt.Errorf("%s: QP %#x: to INIT: no P_Key index %d: %w", p.name, qpn, attr.PKeyIndex, verbs.ErrInvalidArgument)
	case attr.Access&^ValidAccess != 0:
		return fmt.Errorf("%s: QP %#x: to INIT: unknown access flags %#x: %w", p.name, qpn, uint32(attr.Access), verbs.ErrInvalidArgument)
	}
	return nil
}

// CheckRTR checks the attributes of QP qpn's INIT → RTR transition, all but the source
// GID index, whose table is the provider's. The error wraps [verbs.ErrInvalidArgument].
func (p *Provider) CheckRTR(l *Limits, qpn uint32, attr *verbs.RTRAttr) error {
	switch {
	case attr.PathMTU.Bytes() == 0 || attr.PathMTU > l.MaxMTU:
		return fmt.Errorf("%s: QP %#x: to RTR: path MTU %d: %w", p.name, qpn, int(attr.PathMTU), verbs.ErrInvalidArgument)
	case attr.DestQPN > PSNMask || attr.RQPSN > PSNMask:
		return fmt.Errorf("%s: QP %#x: to RTR: QPN %#x or PSN %#x over 24 bits: %w", p.name, qpn, attr.DestQPN, attr.RQPSN, verbs.ErrInvalidArgument)
	case !attr.Dest.IsGlobal:
		return fmt.Errorf("%s: QP %#x: to RTR: RoCE needs a global route (IsGlobal): %w", p.name, qpn, verbs.ErrInvalidArgument)
	case attr.Dest.Port != 1:
		return fmt.Errorf("%s: QP %#x: to RTR: no port %d: %w", p.name, qpn, attr.Dest.Port, verbs.ErrInvalidArgument)
	case attr.MinRNRTimer > 31:
		return fmt.Errorf("%s: QP %#x: to RTR: RNR timer %d: %w", p.name, qpn, attr.MinRNRTimer, verbs.ErrInvalidArgument)
	}
	return nil
}

// CheckRTS checks the attributes of QP qpn's RTR → RTS transition. The error wraps
// [verbs.ErrInvalidArgument].
func (p *Provider) CheckRTS(qpn uint32, attr *verbs.RTSAttr) error {
	switch {
	case attr.SQPSN > PSNMask:
		return fmt.Errorf("%s: QP %#x: to RTS: PSN %#x over 24 bits: %w", p.name, qpn, attr.SQPSN, verbs.ErrInvalidArgument)
	case attr.Timeout > 31 || attr.RetryCount > 7 || attr.RNRRetry > 7:
		return fmt.Errorf("%s: QP %#x: to RTS: timeout %d, retry count %d, RNR retry %d: %w", p.name, qpn, attr.Timeout, attr.RetryCount, attr.RNRRetry, verbs.ErrInvalidArgument)
	}
	return nil
}

// Transition moves QP qpn, whose state is state, from state from to state to for the
// modify_qp named op ("to RTR"), unless the QP is closed ([verbs.ErrClosed]) or not in
// state from ([verbs.ErrInvalidState]). The caller holds the QP's queue locks.
func (p *Provider) Transition(qpn uint32, state *atomic.Int32, closed bool, op string, from, to verbs.QPState) error {
	if closed {
		return fmt.Errorf("%s: QP %#x: %s: %w", p.name, qpn, op, verbs.ErrClosed)
	}
	if !state.CompareAndSwap(int32(from), int32(to)) {
		return fmt.Errorf("%s: QP %#x: %s from %v: %w", p.name, qpn, op, verbs.QPState(state.Load()), verbs.ErrInvalidState)
	}
	return nil
}

// PostErrors are the errors PostSend and PostRecv reject a work request with, made once
// so that a rejected post allocates only its *verbs.PostError.
type PostErrors struct {
	Closed, SendState, RecvState, SendQueueFull, RecvQueueFull error
	Opcode, SendSGEs, RecvSGEs                                 error
	InlineOpcode, InlineTooLarge, InlineMemory                 error
}

// newPostErrors returns the post errors of the provider named name.
func newPostErrors(name string) PostErrors {
	return PostErrors{
		Closed:         fmt.Errorf("%s: post: %w", name, verbs.ErrClosed),
		SendState:      fmt.Errorf("%s: post send: QP not in RTS: %w", name, verbs.ErrInvalidState),
		RecvState:      fmt.Errorf("%s: post receive: QP in RESET: %w", name, verbs.ErrInvalidState),
		SendQueueFull:  fmt.Errorf("%s: post send: max_send_wr outstanding: %w", name, verbs.ErrQueueFull),
		RecvQueueFull:  fmt.Errorf("%s: post receive: max_recv_wr outstanding: %w", name, verbs.ErrQueueFull),
		Opcode:         fmt.Errorf("%s: post send: unknown opcode: %w", name, verbs.ErrInvalidArgument),
		SendSGEs:       fmt.Errorf("%s: post send: more SGEs than max_send_sge: %w", name, verbs.ErrInvalidArgument),
		RecvSGEs:       fmt.Errorf("%s: post receive: more SGEs than max_recv_sge: %w", name, verbs.ErrInvalidArgument),
		InlineOpcode:   fmt.Errorf("%s: post send: inline data with RDMA READ: %w", name, verbs.ErrInvalidArgument),
		InlineTooLarge: fmt.Errorf("%s: post send: inline data over max_inline_data: %w", name, verbs.ErrInvalidArgument),
		InlineMemory:   fmt.Errorf("%s: post send: inline data outside registered memory: %w", name, verbs.ErrInvalidArgument),
	}
}

// CheckPostSend checks send WR w against a QP in state st (closed if closed) with
// capacities c, whose send queue has inUse slots taken (posted minus released by polled
// completions): the QP must be in RTS (or ERROR, which flushes it), the opcode known, the
// SGL within max_send_sge and the queue not full. It returns nil or one of e's errors.
// An inline WR then needs [PostErrors.CheckInline] too, apart so that CheckPostSend
// stays small enough to inline into a provider's post path.
func (e *PostErrors) CheckPostSend(st verbs.QPState, closed bool, c *verbs.QPCaps, inUse uint64, w *verbs.SendWR) error {
	switch {
	case closed:
		return e.Closed
	case st != verbs.QPStateRTS && st != verbs.QPStateError:
		return e.SendState
	case w.Opcode < verbs.OpRDMAWrite || w.Opcode > verbs.OpRDMARead:
		return e.Opcode
	case len(w.SGL) > c.MaxSendSGE:
		return e.SendSGEs
	case inUse >= uint64(c.MaxSendWR):
		return e.SendQueueFull
	}
	return nil
}

// CheckInline checks an inline send WR (verbs.SendInline) of opcode op and SGL sgl,
// which CheckPostSend has passed, against a QP with capacities c: an RDMA READ cannot
// be inline, and the payload must fit max_inline_data. It returns nil or one of e's
// errors.
func (e *PostErrors) CheckInline(c *verbs.QPCaps, op verbs.Opcode, sgl []verbs.SGE) error {
	if op == verbs.OpRDMARead {
		return e.InlineOpcode
	}
	var n uint64
	for _, s := range sgl {
		n += uint64(s.Length)
	}
	if n > uint64(c.MaxInlineData) {
		return e.InlineTooLarge
	}
	return nil
}

// CheckPostRecv checks receive WR w against a QP in state st (closed if closed) with
// capacities c, whose receive queue has inUse slots taken: receives may be posted from
// INIT on, within max_recv_sge, to a queue not full. It returns nil or one of e's errors.
func (e *PostErrors) CheckPostRecv(st verbs.QPState, closed bool, c *verbs.QPCaps, inUse uint64, w *verbs.RecvWR) error {
	switch {
	case closed:
		return e.Closed
	case st == verbs.QPStateReset:
		return e.RecvState
	case len(w.SGL) > c.MaxRecvSGE:
		return e.RecvSGEs
	case inUse >= uint64(c.MaxRecvWR):
		return e.RecvQueueFull
	}
	return nil
}

// ToError checks and makes QP qpn's move to ERROR (ibv_modify_qp to IBV_QPS_ERR): from
// any state but RESET, which fails with [verbs.ErrInvalidState] and changes nothing, as
// the InfiniBand specification has no such transition and the kernel refuses it. The
// caller holds the QP's queue locks and then flushes both queues.
func (p *Provider) ToError(qpn uint32, state *atomic.Int32, closed bool) error {
	if closed {
		return fmt.Errorf("%s: QP %#x: to ERROR: %w", p.name, qpn, verbs.ErrClosed)
	}
	if st := verbs.QPState(state.Load()); st == verbs.QPStateReset {
		return fmt.Errorf("%s: QP %#x: to ERROR from %v: %w", p.name, qpn, st, verbs.ErrInvalidState)
	}
	state.Store(int32(verbs.QPStateError))
	return nil
}

// Fail moves a QP whose state is state to ERROR, as a fatal asynchronous error does,
// unless it is closed or in ERROR already, and reports whether it moved it; the caller
// then has its queues flushed. It takes no lock, so it may be called holding any.
func Fail(state *atomic.Int32, closed *atomic.Bool) bool {
	for {
		s := state.Load()
		if s == int32(verbs.QPStateError) || closed.Load() {
			return false
		}
		if state.CompareAndSwap(s, int32(verbs.QPStateError)) {
			return true
		}
	}
}
