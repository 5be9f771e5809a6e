package rdma

import (
	"fmt"

	"github.com/rsockio/rsock/flowctl"
)

// This file grows a Conn's receive queue ("Receive queues that grow" in the package
// docs; flowctl's "Growing the receive queue"): more receive WQEs posted while a stream
// of small messages keeps running out of them, their credit carried to the peer by the
// next message.

// maybeGrowWQEsLocked doubles the receive WQEs (up to wqeGrowTo) after a data arrival,
// once growAfter arrivals since the last growth have each found a standalone credit
// update due by WQE count while less than half the ring was held: a one-way stream
// whose messages are small against the ring, so its writer runs out of WQE credit
// before it runs out of ring space. Traffic the other way returns WQE credit as it
// goes, so requests and responses never make an update due by count, and a stream of
// large messages makes the ring's update due first (and grows the ring). Called with
// mu held, on the goroutine reaping completions.
func (c *Conn) maybeGrowWQEsLocked() {
	w := c.fc.WQEs()
	if c.wqeGrowTo <= w || c.closing || c.err != nil || c.fc.PeerClosed() {
		return
	}
	if c.fc.OwedWQEs() < min(w/2, flowctl.MaxImmWQECredits) || 2*c.fc.Held() >= c.fc.RingSize() {
		return
	}
	if c.wqeBound++; c.wqeBound < growAfter {
		return
	}
	c.wqeBound = 0
	c.growWQEsLocked(min(w, c.wqeGrowTo-w))
}

// growWQEsLocked posts n more receive WQEs and hands their credit to flowctl; the
// caller posts control messages next, and with a doubling an update is due. The CQ
// entries they need are reserved on the poller first: a CQ that has no room left stops
// growth for good, and the connection goes on with the WQEs it has. Called with mu held.
func (c *Conn) growWQEsLocked(n int) {
	if !c.poll.reserveMore(n) {
		c.wqeGrowTo = 0
		return
	}
	c.ep.entries += n
	first := c.fc.WQEs()
	wr := &c.recvWR[0]
	for i := range n {
		wr.ID = recvWRFlag | c.gen | uint64(first+i)
		if err := c.qp.PostRecv(c.recvWR[:]); err != nil {
			// The WQEs posted so far stay posted, uncredited: harmless, and the QP is
			// failing anyway.
			c.failLocked(qpError("post added receive WQE", err))
			return
		}
	}
	if err := c.fc.GrowWQEs(n); err != nil {
		c.failLocked(fmt.Errorf("%w: grow the receive queue: %w", ErrQPFailed, err))
	}
}
