package flowctl

import "fmt"

// This file is the receiver's half of resizing a ring; see the package docs, "Resizing
// the ring", for the protocol and why it keeps every guarantee.

// Resize asks to replace this side's receive ring by one of size bytes, which the engine
// has registered and which the peer is to write from now on. NextControl then hands out
// the resize message (to the peer's mailbox, with the new ring's description) as soon as
// credit allows; the peer answers with a switch, after which OnArrival places data in
// the new ring. Until the switch arrives, data still lands in the current ring, and until
// the application has consumed what landed there, Unread names it there (see OldRing):
// only then may the engine free it.
//
// size must be a power of two of the same credit unit as the current ring (see
// [RingUnit]): up to 512 KiB for rings that start below it, up to the UnitRingSize
// of the side's Params when it named one. Resize fails with
// [ErrBadParams] for a size out of range, and with [ErrResizeBusy] while a resize is
// under way (requested, announced, or the old ring still holding bytes) or after the
// peer's FIN, when no more data will come.
func (e *Endpoint) Resize(size int) error {
	s := uint64(size)
	if err := e.resizeBusy(); err != nil {
		return err
	}
	switch {
	case size <= 0 || s < e.pol.minRing || s > MaxRingSize || s&(s-1) != 0 || s == e.ring || unitShift(max(s, e.unitRing)) != e.unitShift:
		return fmt.Errorf("%w: resize from %d to %d bytes, want another power of two of credit unit %d", ErrBadParams, e.ring, size, RingUnit(int(e.ring)))
	}
	e.resizeTo = s
	return nil
}

// resizeBusy reports why Resize may not be called now, or nil.
func (e *Endpoint) resizeBusy() error {
	switch {
	case e.err != nil:
		return e.err
	case e.resizeTo != 0 || e.resizing != 0:
		return fmt.Errorf("%w: a ring of %d bytes is announced", ErrResizeBusy, max(e.resizeTo, e.resizing))
	case e.oldRing != 0 && !e.pol.resizeWhileDraining:
		return fmt.Errorf("%w: the old ring holds %d bytes", ErrResizeBusy, e.switchAt-e.consumed)
	case e.peerFIN:
		return fmt.Errorf("%w: the peer's FIN has arrived", ErrResizeBusy)
	}
	return nil
}

// Held is how many bytes of this side's ring the peer may not write now: those buffered
// and those consumed whose credit has not gone back yet. A ring the peer keeps nearly
// full of them limits its stream: the engine grows it.
func (e *Endpoint) Held() int { return int(e.arrived - e.returned) }

// RingSize is the size of the ring data lands in now: the one a switch last made
// current, or the first.
func (e *Endpoint) RingSize() int { return int(e.ring) }

// PeerRingSize is the size of the peer's ring this side writes into now.
func (e *Endpoint) PeerRingSize() int { return int(e.peerRing) }

// Resizing reports whether a resize asked for with Resize has not been answered by the
// peer's switch yet: the engine must keep both rings.
func (e *Endpoint) Resizing() bool { return e.resizeTo != 0 || e.resizing != 0 }

// OldRing reports whether the ring the last switch replaced still holds bytes the
// application has not consumed: Unread names them, in that ring. Once it reports false,
// after a Consume, the engine may free the old ring.
func (e *Endpoint) OldRing() bool { return e.oldRing != 0 }

// switchRing makes the announced ring current: data that arrives from now on lands in
// it, from its start. The bytes still buffered stay in the old ring until consumed, and
// the thresholds of the updates and the spill scale with the ring.
func (e *Endpoint) switchRing() {
	old, next := e.ring, e.resizing
	if e.arrived > e.consumed {
		e.oldRing, e.oldBase = old, e.ringBase
	}
	e.switchAt = e.arrived
	e.ring, e.ringBase, e.resizing = next, e.arrived, 0
	e.pol.ringUpdate = max(e.pol.ringUpdate*next/old, 1)
	e.pol.spillAt = max(e.pol.spillAt*next/old, 1)
}
