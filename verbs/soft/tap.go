package soft

import (
	"github.com/rsockio/rsock/verbs"
)

// TapEvent is one message that crossed the fabric, as a wire capture would show it: the
// payload of an RDMA WRITE or SEND, or the data an RDMA READ fetched.
type TapEvent struct {
	From, To string       // the requester's and the responder's device names
	SrcQPN   uint32       // the requester's QP number
	DestQPN  uint32       // the responder's QP number
	Op       verbs.Opcode // the requester's operation
	Imm      uint32       // the immediate data, for the operations that carry one
	Payload  []byte       // a copy of the message's bytes; the tap may keep it
}

// SetTap makes fn observe every message the fabric delivers successfully, in delivery
// order per QP: tests use it to check what an eavesdropper on the wire would see. fn
// runs on the sending QP's goroutine with the QP locked, so it must return quickly and
// must not call into the fabric. A nil fn removes the tap. A tap costs a copy of every
// payload; without one the data path is unchanged.
func (f *Fabric) SetTap(fn func(TapEvent)) {
	if fn == nil {
		f.tap.Store(nil)
		return
	}
	f.tap.Store(&fn)
}

// tapLocked reports e, just delivered by q, to the fabric's tap if there is one. The
// caller holds q.sq.mu; q.sq.vec still holds the message's local buffers.
func (q *QP) tapLocked(e *wqe) {
	fn := q.dev.fab.tap.Load()
	if fn == nil {
		return
	}
	ev := TapEvent{
		From:    q.dev.attr.Name,
		SrcQPN:  q.qpn,
		DestQPN: q.sq.destQPN,
		Op:      e.op,
		Imm:     e.imm,
		Payload: make([]byte, e.length),
	}
	if d := q.sq.destDev; d != nil {
		ev.To = d.attr.Name
	}
	gather(ev.Payload, q.sq.vec)
	(*fn)(ev)
}
