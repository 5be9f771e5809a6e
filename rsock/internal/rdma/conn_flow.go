package rdma

import (
	"errors"
	"fmt"

	"github.com/rsockio/rsock/verbs"
)

// recvWRFlag marks receive WR IDs: an error completion's opcode is undefined, so the ID
// alone must say which queue it came from.
const recvWRFlag = 1 << 63

// onCompletion handles one completion of this Conn's QP, on the poller's goroutine.
func (c *Conn) onCompletion(wc *verbs.WorkCompletion) {
	if wc.WRID == proofRecvID {
		c.onProof(wc)
		return
	}
	if wc.Status != verbs.WCSuccess {
		c.mu.Lock()
		c.failLocked(qpError("completion", wc.Err()))
		c.mu.Unlock()
		return
	}
	if wc.WRID&recvWRFlag != 0 {
		c.onRecv(wc)
		return
	}
	c.onSendDone(wc.WRID)
}

// onRecv re-posts the consumed receive WQE first (so WQE credit never waits for the
// application), then accounts for what arrived.
func (c *Conn) onRecv(wc *verbs.WorkCompletion) {
	c.recvWR[0].ID = wc.WRID
	perr := c.qp.PostRecv(c.recvWR[:])

	c.mu.Lock()
	defer c.mu.Unlock()
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
	if a.Len > 0 {
		c.spillLocked()
	}
	if a.Len > 0 || c.fc.PeerClosed() {
		signal(c.readable)
	}
	if a.Credited {
		signal(c.writable)
	}
	c.postControlLocked()
}

// onSendDone retires send WRs up to and including the signaled WR id, releasing their
// staging space and send-queue slots.
func (c *Conn) onSendDone(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id < c.sqDone || id >= c.sqPosted {
		c.failLocked(fmt.Errorf("%w: completion for unknown send %d", ErrQPFailed, id))
		return
	}
	c.sqDone = id + 1
	c.stageHead = c.stageEnd[id%c.sqDepth]
	signal(c.writable)
	signal(c.drained)
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

// protocolError wraps a flowctl violation as the Conn's error.
func protocolError(err error) error {
	if errors.Is(err, ErrProtocol) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrProtocol, err)
}
