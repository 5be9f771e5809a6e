package flowctl

import (
	"errors"
	"fmt"
)

// This file is direct placement: a reader's buffer advertised to the writer, which
// writes the next bytes of the stream straight into it instead of into the ring. See
// the package docs, "Direct placement", for the protocol and why it keeps every
// guarantee.

// Advertise asks to advertise a buffer of n bytes of this side's application, which
// the engine has registered for the peer to write: NextControl then hands out the
// advertisement (to the peer's mailbox, with the buffer's description and the cursor
// [Endpoint.Advert] names) as soon as credit allows. The length advertised is n rounded
// down to a whole number of PlaceUnits, at most MaxPlaceLen; Advertise returns it.
//
// Only a side with nothing buffered may advertise, since placed bytes are the next of
// the stream; and only one advertisement is under way at a time. Advertise fails with
// [ErrBadLength] for n below PlaceUnit, and with [ErrPlaceBusy] while bytes are
// buffered, an advertisement is asked for or unanswered, or after the peer's FIN.
func (e *Endpoint) Advertise(n int) (int, error) {
	switch {
	case e.err != nil:
		return 0, e.err
	case n < PlaceUnit:
		return 0, fmt.Errorf("%w: advertise %d bytes, at least %d", ErrBadLength, n, PlaceUnit)
	case e.advertTo != 0 || e.advert != 0:
		return 0, fmt.Errorf("%w: an advertisement is under way", ErrPlaceBusy)
	case e.arrived != e.consumed:
		return 0, fmt.Errorf("%w: %d bytes buffered", ErrPlaceBusy, e.arrived-e.consumed)
	case e.peerFIN:
		return 0, fmt.Errorf("%w: the peer's FIN has arrived", ErrPlaceBusy)
	}
	l := min(uint64(n), MaxPlaceLen) &^ (PlaceUnit - 1)
	e.advertTo = l
	return int(l), nil
}

// Advert describes this side's advertisement: its length and the stream cursor of its
// first byte, while one is handed out and unanswered (length 0 otherwise). The engine
// writes the cursor into the advertisement's payload when NextControl hands it out.
func (e *Endpoint) Advert() (length int, cursor uint64) {
	if e.advert == 0 {
		return 0, 0
	}
	return int(e.advert), e.advertAt
}

// AdvertPending reports whether an advertisement is asked for or unanswered: the
// engine must keep the buffer registered, and may not advertise again.
func (e *Endpoint) AdvertPending() bool { return e.advertTo != 0 || e.advert != 0 }

// AdvertUsable reports whether the peer may still place into the advertised buffer: an
// advertisement is asked for, or handed out, unanswered, and no data or FIN arrived
// since. Once it reports false, the buffer is the application's again, although the
// answer may still be on its way (AdvertPending).
func (e *Endpoint) AdvertUsable() bool {
	return e.advertTo != 0 || (e.advert != 0 && !e.advertStale)
}

// CancelAdvert withdraws the advertisement: one not handed out yet is dropped, and for
// one handed out and unanswered NextControl hands out a cancel, which the peer answers
// with the bytes it placed or a decline. The buffer stays the peer's until that answer
// (or data, or the FIN) arrives: AdvertUsable reports when. Calling it again, or with no
// advertisement, does nothing.
func (e *Endpoint) CancelAdvert() {
	e.advertTo = 0
	if e.advert != 0 && !e.canceled {
		e.canceled, e.cancelDue = true, true
	}
}

// PeerAdvert accounts for the peer's advertisement, which OnArrival just reported: lo32
// is the low 32 bits of the stream cursor its payload names. The engine calls it right
// after that OnArrival, before any other call. The advertisement is usable
// ([Endpoint.Placeable]) when the cursor is this side's producer cursor; one this side
// has written past is declined (NextControl hands out the decline). It fails with
// [ErrBadPlace], a protocol violation, for a cursor this side never wrote or whose
// bytes the peer has returned.
func (e *Endpoint) PeerAdvert(lo32 uint32) error {
	if e.err != nil {
		return e.err
	}
	if !e.peerAdvertNew {
		return errNoAdvert
	}
	e.peerAdvertNew = false
	at := e.prod - uint64(uint32(e.prod)-lo32)
	if at > e.prod || at < e.granted {
		_, err := e.fail(fmt.Errorf("%w: advertisement at cursor %#x, written up to %d and returned up to %d", ErrBadPlace, lo32, e.prod, e.granted))
		return err
	}
	if e.finRequested {
		e.peerAdvert = 0 // the FIN answers it
		return nil
	}
	e.peerAdvertAt = at
	if at != e.prod {
		e.declineDue = true
	}
	return nil
}

// Placeable is how many bytes ReservePlace would place now: the length of the peer's
// advertisement, while it is unanswered, continues the stream at this side's producer
// cursor, and a data credit is free; else zero, and the writer writes to the ring as
// usual (which declines the advertisement).
func (e *Endpoint) Placeable() int {
	if e.err != nil || e.peerAdvert == 0 || e.peerAdvertNew || e.declineDue || e.finRequested ||
		e.switchTo != 0 || e.peerAdvertAt != e.prod || e.credit() <= e.pol.reserve {
		return 0
	}
	return int(e.peerAdvert)
}

// ReservePlace hands out the message that places the next n bytes of the stream into
// the peer's advertised buffer, from its start: an RDMA_WRITE_WITH_IMM of n bytes to the
// buffer's address. n must be between 1 and Placeable. The placed bytes move no cursor
// and take no ring credit: they never touch the peer's ring. The advertisement is
// answered by it.
func (e *Endpoint) ReservePlace(n int) (Msg, error) {
	if e.err != nil {
		return Msg{}, e.err
	}
	if n <= 0 || n > e.Placeable() {
		return Msg{}, fmt.Errorf("%w: ReservePlace(%d) with %d placeable", ErrBadLength, n, e.Placeable())
	}
	e.peerAdvert = 0
	e.sent++
	e.stats.PlacedSent++
	m := Msg{Imm: e.takePlaceCredit(PlacePlaced, 0), Kind: KindPlace}
	m.Len = n
	return m, nil
}

// declinePlace declines the peer's advertisement, if one is unanswered: NextControl
// hands out the decline. The engine has no use for it (writing to the ring declines by
// itself); the tests use it to decline without writing.
func (e *Endpoint) declinePlace() {
	if e.peerAdvert != 0 && !e.peerAdvertNew {
		e.declineDue = true
	}
}

var errNoAdvert = errors.New("flowctl: PeerAdvert without an advertisement")

// placeControl hands out a placement message of the given operation; the caller sets
// the length of an advertisement.
func (e *Endpoint) placeControl(op PlaceOp) Msg {
	e.sent++
	e.stats.ControlSent++
	units := uint32(0)
	if op == PlaceAdvert {
		units = uint32(e.advertTo / PlaceUnit)
	}
	return Msg{Imm: e.takePlaceCredit(op, units), Kind: KindPlace}
}

// takePlaceCredit builds the immediate of a placement message, carrying the WQE credit
// owed; ring credit waits for the next message, as the field holds the placement.
func (e *Endpoint) takePlaceCredit(op PlaceOp, units uint32) uint32 {
	w := min(e.owedWQEs(), e.pol.maxWQE)
	e.wqeReturned += w
	return Imm{Kind: KindPlace, WQECredits: uint32(w), Op: op, PlaceUnits: units}.pack()
}

// onPlace validates an arriving placement message of n bytes against the state of
// both halves, before OnArrival accounts for its credit.
func (e *Endpoint) onPlace(m Imm, n uint64) error {
	switch m.Op {
	case PlaceAdvert:
		if e.peerAdvert != 0 || e.peerAdvertNew {
			return fmt.Errorf("%w: an advertisement before the last one's answer", ErrBadPlace)
		}
	case PlacePlaced, PlaceDecline:
		switch {
		case e.peerFIN:
			return fmt.Errorf("%w: %v after the FIN", ErrAfterFIN, m.Op)
		case e.advert == 0:
			return fmt.Errorf("%w: %v with no advertisement", ErrBadPlace, m.Op)
		case m.Op == PlacePlaced && e.advertStale:
			return fmt.Errorf("%w: %d bytes placed after data arrived", ErrBadPlace, n)
		case n > e.advert:
			return fmt.Errorf("%w: %d bytes placed into %d", ErrBadPlace, n, e.advert)
		}
	}
	return nil
}

// placeArrived applies an accepted placement message.
func (e *Endpoint) placeArrived(m Imm, n uint64, a *Arrival) {
	a.Op = m.Op
	switch m.Op {
	case PlaceAdvert:
		e.peerAdvert, e.peerAdvertNew = uint64(m.PlaceUnits)*PlaceUnit, true
	case PlacePlaced:
		a.Len = int(n)
		e.advert = 0
		e.stats.PlacedReceived++
		return
	case PlaceDecline:
		e.advert = 0
	case PlaceCancel:
		if e.peerAdvert != 0 && !e.peerAdvertNew {
			e.declineDue = true
		} // else answered already: the answer is on its way
	}
	e.stats.ControlReceived++
}
