package flowctl

import "fmt"

// Reservation is the result of [Endpoint.ReserveData]: up to two data messages that
// together carry the next Bytes bytes of the stream. There are two when the bytes cross
// the end of the peer's ring: Msgs[0] runs to the ring's end and Msgs[1] starts at its
// beginning.
type Reservation struct {
	Msgs  [2]Msg // the first Count are valid, in the order they must be posted
	Count int    // 0, 1 or 2
	Bytes int    // total payload: Msgs[0].Len + Msgs[1].Len
}

// credit is how many more messages the peer's receive queue can take.
func (e *Endpoint) credit() uint64 { return e.wqeLimit - e.sent }

// free is how many bytes may be written into the peer's ring without overwriting bytes
// its application has not consumed.
func (e *Endpoint) free() uint64 { return e.granted + e.peerRing - e.prod }

// ReserveData hands out the next at most n bytes of the stream toward the peer: as much
// as the peer's free ring space and the data share of its WQE credit allow, possibly
// less than n, and nothing (Count 0) when the writer must wait for credit. The caller
// must post every returned message, in order, before handing out any other message; the
// payload of Msgs[0] is the first Msgs[0].Len bytes of what it is writing, and so on.
//
// ReserveData(0) reserves nothing and is not an error: a zero-length Write sends
// nothing. After CloseWrite it fails with [ErrWriteClosed], and after a protocol
// violation with that violation.
func (e *Endpoint) ReserveData(n int) (Reservation, error) {
	var r Reservation
	switch {
	case e.err != nil:
		return r, e.err
	case n < 0:
		return r, fmt.Errorf("%w: ReserveData(%d)", ErrBadLength, n)
	case e.finRequested:
		return r, ErrWriteClosed
	}
	want := min(uint64(n), e.free())
	for want > 0 && e.credit() > e.pol.reserve {
		off := e.prod & (e.peerRing - 1)
		l := min(want, e.peerRing-off)
		r.Msgs[r.Count] = Msg{Piece: Piece{Off: int(off), Len: int(l)}, Imm: e.takeCredit(KindData)}
		r.Count++
		r.Bytes += int(l)
		e.prod += l
		e.sent++
		e.stats.DataSent++
		want -= l
	}
	return r, nil
}

// Writable reports how many bytes ReserveData would hand out now if asked for more:
// zero when a writer must wait for credit.
func (e *Endpoint) Writable() int {
	c := e.credit()
	if e.err != nil || e.finRequested || c <= e.pol.reserve {
		return 0
	}
	free := e.free()
	if c == e.pol.reserve+1 {
		// Credit for one message only: it cannot continue past the ring's end.
		free = min(free, e.peerRing-(e.prod&(e.peerRing-1)))
	}
	return int(free)
}

// CloseWrite ends the stream toward the peer: ReserveData fails from now on, and
// NextControl hands out the FIN as soon as a WQE credit allows. Because the caller posts
// messages in the order they are handed out, the FIN follows all data. Calling it again
// does nothing.
func (e *Endpoint) CloseWrite() { e.finRequested = true }

// FINPending reports whether CloseWrite was called but the FIN has not been handed out
// yet, because no WQE credit was available.
func (e *Endpoint) FINPending() bool { return e.finRequested && !e.finSent }

// NextControl hands out the next control message to post, if one is due and may be sent:
// the FIN after CloseWrite, else a standalone credit update when this side owes the peer
// half its WQEs or half its ring (see the package docs). Like every message, it carries
// all the credit that fits in its immediate. The caller must post it before handing out
// any other message.
//
// Call it in a loop until it returns false after every event that can change the answer:
// OnArrival, Consume, CloseWrite. A false answer with a FIN pending or an update due
// means the WQE credit it needs is on its way; the arrival that brings it is such an event.
func (e *Endpoint) NextControl() (Msg, bool) {
	if e.err != nil {
		return Msg{}, false
	}
	var kind Kind
	switch {
	case e.finRequested && !e.finSent:
		kind = KindFIN
	case e.updateDue():
		kind = KindCredit
	default:
		return Msg{}, false
	}
	if !e.controlCredit() {
		return Msg{}, false
	}
	if kind == KindFIN {
		e.finSent = true
	}
	return e.control(kind), true
}

// Keepalive hands out a keepalive message, carrying whatever credit is owed, if it can
// be sent without touching the reserved WQE credit. It is meant for an idle-connection
// timer: when it returns false the peer owes this side credit and will send it, which is
// traffic enough.
func (e *Endpoint) Keepalive() (Msg, bool) {
	if e.err != nil || e.credit() <= e.pol.reserve {
		return Msg{}, false
	}
	return e.control(KindKeepalive), true
}

// controlCredit reports whether a control message may be sent now. It may use the
// reserve, but the very last WQE credit only if the message returns WQE credit too. That
// rule is what makes a state where neither side has a credit left unreachable: the last
// message before such a state would have to have carried a credit back (see the package
// docs for the argument).
func (e *Endpoint) controlCredit() bool {
	switch c := e.credit(); {
	case c >= 2:
		return true
	case c == 1:
		return !e.pol.lastCredit || e.reaped > e.wqeReturned
	}
	return false
}

// control hands out a zero-length message of the given kind.
func (e *Endpoint) control(kind Kind) Msg {
	e.sent++
	e.stats.ControlSent++
	return Msg{Imm: e.takeCredit(kind)}
}
