package rdma

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// Work request IDs. Bit 63 marks receive WRs: an error completion's opcode is
// undefined, so the ID alone must say which queue it came from. Bits 48 to 62 are the
// endpoint's generation, bits 0 to 47 the send sequence number (mod 2^48) or the
// receive WQE's index:
//
//	 63   62      48 47                                    0
//	| R | generation |  send sequence / receive WQE index   |
//
// The generation is what makes teardown safe on a shared CQ. A QP moved to ERROR
// flushes its outstanding WRs into the CQ, and not every device removes a destroyed
// QP's completions from it (rxe leaves them); a QP created next may get the same
// number (devices reuse them) and be attached to the same poller before the poller
// has reaped the old ones. Completions are routed by QP number, so the new connection
// would take the old one's flushes for its own and fail. Every endpoint gets a new
// generation, and a Conn ignores completions of another.
const (
	recvWRFlag = 1 << 63
	genShift   = 48
	genMask    = (1<<15 - 1) << genShift
	seqMask    = 1<<genShift - 1
)

// nextGen numbers endpoints: 2^15 endpoints in a row have distinct generations, and a
// destroyed QP's completions, which precede any of its successor's in the CQ, are
// reaped long before as many endpoints are created.
var nextGen atomic.Uint64

// newGen returns the next generation, shifted into place.
func newGen() uint64 { return (nextGen.Add(1) << genShift) & genMask }

// onCompletion handles one completion of this Conn's QP, on the poller's goroutine.
// A completion of another generation belongs to a destroyed QP that had the same
// number; it is counted and dropped.
func (c *Conn) onCompletion(wc *verbs.WorkCompletion) {
	if wc.WRID&genMask != c.gen {
		c.stale.Add(1)
		return
	}
	if wc.WRID&recvWRFlag != 0 && wc.WRID&seqMask == proofRecvIndex {
		c.onProof(wc)
		return
	}
	if wc.Status != verbs.WCSuccess {
		c.stats.completionFailed(wc.Status)
		cause := c.transportCause(wc) // before mu: the QP takes its own lock
		c.mu.Lock()
		err := c.err // the first failure is the Conn's: the flushed WRs that follow it need no error of their own
		if err == nil {
			err = completionError("completion", wc, cause)
		}
		c.failLocked(err)
		c.mu.Unlock()
		return
	}
	if wc.WRID&recvWRFlag != 0 {
		c.onRecv(wc)
		return
	}
	c.onSendDone(wc.WRID & seqMask)
}

// onRecv re-posts the consumed receive WQE first (so WQE credit never waits for the
// application), then accounts for what arrived.
func (c *Conn) onRecv(wc *verbs.WorkCompletion) {
	c.recvWR[0].ID = wc.WRID
	perr := c.qp.PostRecv(c.recvWR[:])

	c.mu.Lock()
	defer c.mu.Unlock()
	c.heardLocked()
	if perr != nil {
		c.failLocked(qpError("re-post receive", perr))
		return
	}
	if wc.Opcode != verbs.WCRecvRDMAWithImm || wc.Flags&verbs.WCWithImm == 0 {
		c.failLocked(fmt.Errorf("%w: unexpected %v completion", ErrProtocol, wc.Opcode))
		return
	}
	a, err := c.fc.OnArrival(wc.ByteLen, wc.Imm)
	if err != nil {
		c.failLocked(protocolError(err))
		return
	}
	switch a.Kind {
	case flowctl.KindResize:
		if err := c.onResizeLocked(wc.ByteLen, wc.Imm); err != nil {
			c.failLocked(protocolError(err))
			return
		}
	case flowctl.KindSwitch:
		c.onSwitchLocked()
	case flowctl.KindPlace:
		if err := c.onPlaceLocked(a); err != nil { // place.go
			c.failLocked(protocolError(err))
			return
		}
	}
	if a.Kind == flowctl.KindData {
		c.dataArrivals++
		c.stats.received(a.Len)
		c.spillLocked()
		c.maybeGrowLocked(a.Len)
		c.maybeGrowWQEsLocked()
	}
	c.readChanges.Add(1)
	if c.readParked && (a.Kind == flowctl.KindData || a.Kind == flowctl.KindPlace || c.fc.PeerClosed()) {
		signal(c.readable)
	}
	if c.writeParked && a.Credited {
		signal(c.writable)
	}
	c.postControlLocked()
}

// onSendDone retires send WRs up to and including the signaled WR whose sequence
// number is seq mod 2^48, releasing their staging space and send-queue slots.
func (c *Conn) onSendDone(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.sqDone + (seq-c.sqDone)&seqMask
	if id < c.sqDone || id >= c.sqPosted {
		c.failLocked(fmt.Errorf("%w: completion for unknown send %d", ErrQPFailed, id))
		return
	}
	c.heardLocked()
	c.sqDone = id + 1
	// After a larger staging buffer replaced the old one, the old one's sends end
	// below the new one's start: the head never moves back.
	c.stageHead = max(c.stageHead, c.stageEnd[id%c.sqDepth])
	c.freeOldStageLocked()
	if c.writeParked {
		signal(c.writable)
	}
	if c.closing {
		signal(c.drained) // only Close waits for it, after setting closing
	}
	c.postControlLocked()
}

// onCQError fails the Conn when its shared CQ fails.
func (c *Conn) onCQError(err error) {
	c.mu.Lock()
	c.failLocked(fmt.Errorf("%w: %w", ErrCQFailed, err))
	c.mu.Unlock()
}

// qpError wraps a verbs failure as the Conn's error.
func qpError(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrQPFailed, op, err)
}

// transportCause is the local error behind a completion that failed for want of an
// answer (WCRetryExcErr), where the QP knows one (verbs.TransportCauser: shm's, when
// the process ran out of files to reach its peer), else nil.
func (c *Conn) transportCause(wc *verbs.WorkCompletion) error {
	if wc.Status != verbs.WCRetryExcErr {
		return nil
	}
	if tc, ok := c.qp.(verbs.TransportCauser); ok {
		return tc.TransportCause()
	}
	return nil
}

// completionError is a failed completion of op as the Conn's error, naming cause, if
// any (transportCause), after the status it explains.
func completionError(op string, wc *verbs.WorkCompletion, cause error) error {
	if cause != nil {
		return fmt.Errorf("%w: %s: %w: %w", ErrQPFailed, op, wc.Err(), cause)
	}
	return qpError(op, wc.Err())
}

// protocolError wraps a flowctl violation as the Conn's error.
func protocolError(err error) error {
	if errors.Is(err, ErrProtocol) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrProtocol, err)
}
