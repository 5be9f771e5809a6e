package flowctl

import "fmt"

// This file is the receiver's half of growing the receive queue; see the package docs,
// "Growing the receive queue", for why it needs no message of its own.

// GrowWQEs records that the engine has posted n more receive WQEs, which it keeps
// posted from now on like the first ones: the next message to the peer returns them as
// WQE credit, with the credit owed for messages received, and the standalone update
// threshold scales with the new count. Doubling the count (or more) makes an update
// due at once, so the peer learns of the new WQEs without waiting for traffic.
//
// The WQEs must be posted before GrowWQEs is called: from then on they may be returned.
// GrowWQEs fails with [ErrBadParams] if n is not positive or would take the count past
// the GrowWQEsTo of this side's Params, and after a protocol violation with that
// violation. The peer must have said it takes such credit (it knows this side's
// GrowWQEsTo); a peer that does not reports [ErrCreditOverflow].
func (e *Endpoint) GrowWQEs(n int) error {
	if e.err != nil {
		return e.err
	}
	if n <= 0 || e.wqes+uint64(n) > e.maxWQEs {
		return fmt.Errorf("%w: %d more receive WQEs on %d, want up to %d in all", ErrBadParams, n, e.wqes, e.maxWQEs)
	}
	old := e.wqes
	e.wqes += uint64(n)
	e.grown += uint64(n)
	e.pol.wqeUpdate = min(max(e.pol.wqeUpdate*e.wqes/old, 1), e.pol.maxWQE)
	return nil
}

// WQEs is how many receive WQEs this side keeps posted now: its Params' RecvWQEs plus
// what GrowWQEs added.
func (e *Endpoint) WQEs() int { return int(e.wqes) }

// OwedWQEs is how many WQE credits this side owes the peer now: WQEs re-posted for
// messages received, or added, that no message has returned yet. One-way traffic makes
// it climb until a standalone update is due at half the WQEs; traffic the other way
// returns it as it goes.
func (e *Endpoint) OwedWQEs() int { return int(e.owedWQEs()) }
