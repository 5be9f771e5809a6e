package flowctl

import (
	"fmt"
	"math/bits"
)

// Arrival describes a message OnArrival accepted.
type Arrival struct {
	Kind Kind
	// Piece is where a data message's bytes landed in our ring. For bytes placed into
	// an advertised buffer (KindPlace, PlacePlaced), Len is how many, from the
	// buffer's start, and Off is zero. Zero for other kinds.
	Piece
	// Credited reports that the message returned send credit: writers waiting for
	// credit, and a pending FIN, may now proceed.
	Credited bool
	// Op is the operation of a placement message (Kind KindPlace). After an
	// advertisement the engine reads its payload and calls PeerAdvert at once. Placed
	// bytes (Piece.Len) follow every byte of the ring already arrived.
	Op PlaceOp
}

// OnArrival accounts for one receive completion from the peer: byteLen and imm are the
// completion's byte length and immediate. The caller must have re-posted a receive WQE
// in place of the one this completion consumed before it calls OnArrival, because from
// now on that WQE may be returned to the peer as credit. Completions must be passed in
// the order they were polled.
//
// A data message's bytes are now readable (see Unread). Credit the message carries is
// applied to the send half. Any error is a protocol violation by the peer, wrapping one
// of ErrMalformed, ErrRingOverrun, ErrWQEOverrun, ErrCreditOverflow, ErrAfterFIN,
// ErrBadResize or ErrBadPlace; the Endpoint then stays failed and the connection should be closed with
// that error.
func (e *Endpoint) OnArrival(byteLen, imm uint32) (Arrival, error) {
	if e.err != nil {
		return Arrival{}, e.err
	}
	kind, wqes, ring, ringLog2, op, units, ok := decodeImm(imm, byteLen)
	if !ok {
		return e.fail(malformedImm(imm, byteLen))
	}
	if e.owedWQEs() >= e.wqes {
		return e.fail(fmt.Errorf("%w: message %d with %d WQEs granted", ErrWQEOverrun, e.reaped+1, e.wqes-e.grown+e.wqeReturned))
	}
	n := uint64(byteLen)
	switch kind {
	case KindData:
		if e.peerFIN {
			return e.fail(fmt.Errorf("%w: %d bytes of data", ErrAfterFIN, n))
		}
		if e.arrived+n > e.returned+e.ring {
			return e.fail(fmt.Errorf("%w: %d bytes at cursor %d, granted up to %d", ErrRingOverrun, n, e.arrived, e.returned+e.ring))
		}
	case KindFIN:
		if e.peerFIN {
			return e.fail(fmt.Errorf("%w: second FIN", ErrAfterFIN))
		}
	case KindResize:
		size := uint64(1) << ringLog2
		switch {
		case e.switchDue:
			return e.fail(fmt.Errorf("%w: a second resize before the switch", ErrBadResize))
		case size < e.pol.minRing || size == e.peerRing || unitShift(max(size, e.peerUnitRing)) != e.peerUnitShift:
			return e.fail(fmt.Errorf("%w: from %d to %d bytes", ErrBadResize, e.peerRing, size))
		}
	case KindSwitch:
		if e.resizing == 0 && !e.pol.resizeEarly {
			return e.fail(fmt.Errorf("%w: switch without a resize", ErrBadResize))
		}
	case KindPlace:
		if err := e.onPlace(Imm{Kind: kind, Op: op, PlaceUnits: units}, n); err != nil {
			return e.fail(err)
		}
	}
	w, added := uint64(wqes), uint64(0)
	if used := e.sent - (e.wqeLimit - e.peerWQEs); w > used {
		// Credit beyond the messages sent is WQEs the peer added (GrowWQEs).
		if added = w - used; e.peerWQEs+added > e.peerMaxWQEs {
			return e.fail(fmt.Errorf("%w: %d WQE credits returned, %d outstanding and %d more WQEs allowed", ErrCreditOverflow, w, used, e.peerMaxWQEs-e.peerWQEs))
		}
	}
	r := uint64(ring) << e.peerUnitShift
	if used := e.prod - e.granted; r > used {
		return e.fail(fmt.Errorf("%w: %d ring bytes returned, %d outstanding", ErrCreditOverflow, r, used))
	}

	e.reaped++
	e.peerWQEs += added
	e.wqeLimit += w
	e.granted += r
	a := Arrival{Kind: kind, Credited: w != 0 || r != 0}
	switch kind {
	case KindData:
		a.Piece = Piece{Off: int((e.arrived - e.ringBase) & (e.ring - 1)), Len: int(n)}
		e.arrived += n
		e.stats.DataReceived++
		if e.advert != 0 || e.advertTo != 0 {
			// The peer wrote past the advertisement's cursor: it will not place into it.
			e.advertTo, e.advertStale = 0, true
		}
		return a, nil
	case KindFIN:
		e.peerFIN = true
		// The FIN answers an advertisement: nothing follows it.
		e.advertTo, e.advert, e.cancelDue = 0, 0, false
	case KindPlace:
		e.placeArrived(Imm{Kind: kind, Op: op, PlaceUnits: units}, n, &a)
		return a, nil
	case KindResize:
		e.switchDue, e.switchTo = true, uint64(1)<<ringLog2
	case KindSwitch:
		if !e.pol.resizeEarly {
			e.switchRing()
		}
	}
	e.stats.ControlReceived++
	return a, nil
}

// Buffered is how many bytes have arrived and not been consumed.
func (e *Endpoint) Buffered() int { return int(e.arrived - e.consumed) }

// Unread returns the next buffered bytes as up to two ranges of one ring, in stream
// order; second is empty unless the bytes wrap around the ring's end. The ring is the
// current one, or, while [Endpoint.OldRing] reports true, the one the last switch
// replaced: then Unread names only the bytes still in it, and the bytes after them are
// in the current ring. The bytes stay put until Consume releases them, so the caller
// may copy them out without holding its lock.
func (e *Endpoint) Unread() (first, second Piece) {
	end, size, base := e.arrived, e.ring, e.ringBase
	if e.oldRing != 0 {
		end, size, base = e.switchAt, e.oldRing, e.oldBase
	}
	n := end - e.consumed
	if n == 0 {
		return Piece{}, Piece{}
	}
	off := (e.consumed - base) & (size - 1)
	l := min(n, size-off)
	first = Piece{Off: int(off), Len: int(l)}
	if l < n {
		second = Piece{Len: int(n - l)}
	}
	return first, second
}

// Consume releases the first n buffered bytes, which the application has read, so that
// the peer may write over them once the credit reaches it. Call NextControl afterwards:
// an update may be due. Consume fails with [ErrBadLength] if n is negative or more than
// is buffered.
func (e *Endpoint) Consume(n int) error {
	if n < 0 || uint64(n) > e.arrived-e.consumed {
		return fmt.Errorf("%w: Consume(%d) with %d bytes buffered", ErrBadLength, n, e.arrived-e.consumed)
	}
	e.consumed += uint64(n)
	if e.oldRing != 0 && e.consumed >= e.switchAt {
		e.oldRing = 0 // the engine may free it
	}
	return nil
}

// Spillable is how many buffered bytes the engine should move out of the ring now, into
// memory of its own with room bytes free, when the application is not reading: all of
// them, up to room, once the peer holds no ring credit (see [Endpoint.PeerRingCredit])
// and half the ring or more is buffered; none before that, nor after the peer's FIN (no
// more data will come, so freeing ring space frees no writer). The engine copies them
// out of the ring (Unread names them) and calls Consume: to the protocol they are
// consumed, so their ring credit goes back to the peer and the writer keeps going
// although nobody reads. See the package docs, "Spilling".
//
// The engine must ask after every event that can make the answer non-zero while its
// application is not reading: a data arrival, and the end of every read.
func (e *Endpoint) Spillable(room int) int {
	b := e.arrived - e.consumed
	if e.err != nil || e.peerFIN || room <= 0 || b == 0 || b < e.pol.spillAt || e.PeerRingCredit() > 0 {
		return 0
	}
	return int(min(b, uint64(room)))
}

// PeerRingCredit is how many more bytes of data the peer may write into the ring, as
// this side counts: the credit returned (handed out in messages) plus the ring, minus
// what arrived. It is the limit OnArrival holds the peer to. While it is positive, a
// peer with data to write is not blocked on ring space (credit on its way reaches it),
// so another arrival follows; at zero the peer may be blocked until this side consumes
// or spills. The engine skips the spill at the end of a read while it is positive (see
// "Spilling" in the package docs).
func (e *Endpoint) PeerRingCredit() int {
	limit := e.returned + e.ring
	if e.arrived >= limit {
		return 0
	}
	return int(limit - e.arrived)
}

// PeerClosed reports whether the peer's FIN has arrived. All its data arrived before
// it, so once Buffered is zero as well the stream is at its end (io.EOF).
func (e *Endpoint) PeerClosed() bool { return e.peerFIN }

// updateDue reports whether this side owes the peer enough credit to send a standalone
// update: half its receive WQEs, or (while the peer may still send data) half its ring.
// Both thresholds matter for progress: a peer that is out of either kind of credit is
// owed at least the threshold (see the package docs).
func (e *Endpoint) updateDue() bool {
	return e.owedWQEs() >= e.pol.wqeUpdate ||
		(!e.peerFIN && e.returnable() >= e.pol.ringUpdate)
}

// owedWQEs is how many WQE credits this side owes the peer: the WQEs re-posted for
// messages received, and those GrowWQEs added, that no message has returned yet.
func (e *Endpoint) owedWQEs() uint64 { return e.reaped + e.grown - e.wqeReturned }

// returnable is how much ring credit this side may return now: the bytes consumed since
// the last return, rounded down to whole units.
func (e *Endpoint) returnable() uint64 {
	return (e.consumed &^ (1<<e.unitShift - 1)) - e.returned
}

// takeCredit builds the immediate of an outgoing message of the given kind, carrying as
// much of the owed credit as fits; the rest waits for a later message. Counting credit as
// returned here, before the message is posted, is safe: the peer cannot use it before
// the message arrives, and the caller posts every message it is handed.
func (e *Endpoint) takeCredit(kind Kind) uint32 {
	w := min(e.owedWQEs(), e.pol.maxWQE)
	e.wqeReturned += w
	if kind == KindResize {
		// The ring field names the new ring; owed ring credit waits for the next message.
		return Imm{Kind: kind, WQECredits: uint32(w), RingLog2: uint8(bits.Len64(e.resizeTo) - 1)}.pack()
	}
	u := min(e.returnable()>>e.unitShift, e.pol.maxRing)
	e.returned += u << e.unitShift
	return Imm{Kind: kind, WQECredits: uint32(w), RingCredits: uint32(u)}.pack()
}
