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
// its application has not consumed. After a switch to a smaller ring, more than its
// size may be outstanding: then nothing may be written until credit brings it below.
func (e *Endpoint) free() uint64 {
	if end := e.granted + e.peerRing; end > e.prod {
		return end - e.prod
	}
	return 0
}

// peerOff is where the stream byte at cursor c lands in the peer's current ring, which
// began at cursor peerBase.
func (e *Endpoint) peerOff(c uint64) uint64 { return (c - e.peerBase) & (e.peerRing - 1) }

// ReserveData hands out the next at most n bytes of the stream toward the peer: as much
// as the peer's free ring space and the data share of its WQE credit allow, possibly
// less than n, and nothing (Count 0) when the writer must wait for credit. The caller
// must post every returned message, in order, before handing out any other message; the
// payload of Msgs[0] is the first Msgs[0].Len bytes of what it is writing, and so on.
//
// ReserveData(0) reserves nothing and is not an error: a zero-length Write sends
// nothing. Nor does ReserveData reserve anything while the switch answering a peer's
// resize waits for credit: NextControl hands it out first. After CloseWrite it fails
// with [ErrWriteClosed], and after a protocol violation with that violation.
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
	if e.switchTo != 0 {
		want = 0
	}
	for want > 0 && e.credit() > e.pol.reserve {
		off := e.peerOff(e.prod)
		l := min(want, e.peerRing-off)
		r.Msgs[r.Count] = Msg{Piece: Piece{Off: int(off), Len: int(l)}, Imm: e.takeCredit(KindData), Kind: KindData}
		r.Count++
		r.Bytes += int(l)
		e.prod += l
		e.sent++
		e.stats.DataSent++
		want -= l
	}
	if r.Count > 0 && e.peerAdvert != 0 {
		e.declineDue = true // our cursor moved past it: it can never be used
	}
	return r, nil
}

// Writable reports how many bytes ReserveData would hand out now if asked for more:
// zero when a writer must wait for credit.
func (e *Endpoint) Writable() int {
	c := e.credit()
	if e.err != nil || e.finRequested || c <= e.pol.reserve || e.switchTo != 0 {
		return 0
	}
	free := e.free()
	if c == e.pol.reserve+1 {
		// Credit for one message only: it cannot continue past the ring's end.
		free = min(free, e.peerRing-e.peerOff(e.prod))
	}
	return int(free)
}

// CloseWrite ends the stream toward the peer: ReserveData fails from now on, and
// NextControl hands out the FIN as soon as a WQE credit allows. Because the caller posts
// messages in the order they are handed out, the FIN follows all data. Calling it again
// does nothing.
func (e *Endpoint) CloseWrite() {
	e.finRequested = true
	e.peerAdvert, e.declineDue = 0, false // the FIN answers it
}

// FINPending reports whether CloseWrite was called but the FIN has not been handed out
// yet, because no WQE credit was available.
func (e *Endpoint) FINPending() bool { return e.finRequested && !e.finSent }

// NextControl hands out the next control message to post, if one is due and may be sent:
// the switch answering a peer's resize, the FIN after CloseWrite, the answer or cancel
// of a placement, the advertisement Advertise asked for, the resize Resize asked for,
// else a standalone credit update when this side owes the peer half its WQEs or half
// its ring (see the package docs). Like every message, it carries all the credit that
// fits in its immediate. The caller must post it before handing out any other message; a
// resize (Kind KindResize) goes to the peer's mailbox with the new ring's description.
//
// Call it in a loop until it returns false after every event that can change the answer:
// OnArrival, Consume, CloseWrite, Resize, Advertise, CancelAdvert, ReserveData. A false
// answer with a message due means the WQE credit it needs is on its way; the arrival
// that brings it is such an event.
func (e *Endpoint) NextControl() (Msg, bool) {
	if e.err != nil {
		return Msg{}, false
	}
	// The switch and the resize spend credit as data does, never the reserve: the
	// argument that credit comes back to a writer covers them (see the package docs).
	dataCredit := e.credit() > e.pol.reserve
	switch {
	case e.switchDue && dataCredit:
		// Data from here on goes to the new ring, from its start.
		e.peerRing, e.switchTo, e.switchDue = e.switchTo, 0, false
		if !e.pol.keepBase {
			e.peerBase = e.prod
		}
		return e.control(KindSwitch), true
	case e.finRequested && !e.finSent:
		if !e.controlCredit() {
			return Msg{}, false
		}
		e.finSent = true
		return e.control(KindFIN), true
	case e.declineDue && dataCredit:
		e.peerAdvert, e.declineDue = 0, false
		return e.placeControl(PlaceDecline), true
	case e.cancelDue && dataCredit:
		e.cancelDue = false
		return e.placeControl(PlaceCancel), true
	case e.advertTo != 0 && dataCredit:
		m := e.placeControl(PlaceAdvert)
		m.Len = AdvertLen
		e.advert, e.advertAt, e.advertTo = e.advertTo, e.arrived, 0
		e.advertStale, e.canceled = false, false
		return m, true
	case e.resizeTo != 0 && dataCredit:
		m := e.control(KindResize)
		m.Len = ResizeLen
		e.resizing, e.resizeTo = e.resizeTo, 0
		if e.pol.resizeEarly {
			e.switchRing()
		}
		return m, true
	case e.updateDue() && e.controlCredit():
		return e.control(KindCredit), true
	}
	return Msg{}, false
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

// CreditNow hands out a standalone credit update although none is due by the
// thresholds, for a peer that may be blocked on ring space ([Endpoint.PeerRingCredit]
// is zero) while the application reads: the bytes it consumed go back at once, not once
// half the ring has been. Like Keepalive, it never takes the reserved WQE credit, so the
// credit argument of the package docs is unchanged: it is an update sent early. It
// returns false when less than an eighth of the ring, or less than [CreditNowMin], is
// owed (a reader of small pieces would otherwise send an update per piece, doubling the
// messages of a stream) or the WQE credit is down to the reserve; the engine then spills
// instead (see "Spilling").
func (e *Endpoint) CreditNow() (Msg, bool) {
	if e.err != nil || e.returnable() == 0 || e.returnable() < min(e.pol.ringUpdate/4, CreditNowMin) || e.credit() <= e.pol.reserve {
		return Msg{}, false
	}
	return e.control(KindCredit), true
}

// CreditNowMin caps the ring credit an early update ([Endpoint.CreditNow]) waits for at
// 16 KiB: on a large ring an eighth is megabytes, and a reader that stops short of it
// while its peer is blocked would have the whole buffered ring spilled, a copy of every
// byte it then reads, where one message would have freed the writer.
const CreditNowMin = 16 << 10

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
		return !e.pol.lastCredit || e.owedWQEs() > 0
	}
	return false
}

// control hands out a zero-length message of the given kind.
func (e *Endpoint) control(kind Kind) Msg {
	e.sent++
	e.stats.ControlSent++
	return Msg{Imm: e.takeCredit(kind), Kind: kind}
}
