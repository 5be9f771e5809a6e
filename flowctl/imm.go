package flowctl

import "fmt"

// This file is the wire format of the data path: the 32-bit immediate that rides on every
// RDMA_WRITE_WITH_IMM, together with the completion's byte length.
//
//	 31    29 28            20 19                                      0
//	+--------+----------------+-----------------------------------------+
//	|  kind  |  WQE credits   |              ring credits               |
//	| 3 bits |     9 bits     |                 20 bits                 |
//	+--------+----------------+-----------------------------------------+
//
//	kind          1 data, 2 credit update, 3 FIN, 4 keepalive, 5 resize, 6 switch, 7
//	              placement; 0 is malformed.
//	WQE credits   receive WQEs the sender of this message has re-posted since it last
//	              said so: the reader may send that many more messages.
//	ring credits  bytes of the sender's receive ring its application has consumed since it
//	              last said so, in ring units (see [RingUnit]): the reader may write that
//	              much further into the ring.
//
// The payload length is not in the immediate: it is the completion's byte length, which
// the hardware reports exactly. A data message has a length of at least one byte, a
// resize exactly [ResizeLen] bytes (written to the receiver's mailbox, not its ring); the
// other kinds have none. Every kind carries credits, so credit piggybacks on whatever
// traffic flows the other way, with two exceptions: in a resize, the ring-credit field
// holds log2 of the new ring's size instead, and in a placement message it holds the
// operation and its argument (owed ring credit waits for the next message):
//
//	 31    29 28            20 19 18 17                                 0
//	+--------+----------------+-----+------------------------------------+
//	|   7    |  WQE credits   | op  |  advertised length in PlaceUnits   |
//	+--------+----------------+-----+------------------------------------+
//
//	op            0 advertisement (AdvertLen bytes to the mailbox; the length is not
//	              zero), 1 placed (the bytes, written into the advertised buffer), 2
//	              decline, 3 cancel (both zero bytes; the length field zero).

// Kind says what a message is. It occupies the top three bits of the immediate.
type Kind uint8

// The message kinds. The zero Kind is not a valid kind, so an immediate of zero, as from
// memory that was never written, is rejected.
const (
	// KindData carries application bytes, written into the receiver's ring at the
	// sender's producer cursor.
	KindData Kind = 1
	// KindCredit is a standalone credit update: zero bytes, credits only.
	KindCredit Kind = 2
	// KindFIN ends the sender's byte stream (CloseWrite). It follows all the data.
	KindFIN Kind = 3
	// KindKeepalive proves the connection is alive when nothing else has been sent. It
	// carries credits like any other message.
	KindKeepalive Kind = 4
	// KindResize announces that the sender's receive ring is being replaced by one of
	// 2^RingLog2 bytes. Its payload, [ResizeLen] bytes that the engine defines (where
	// the new ring is and its key), is written to the receiver's mailbox. See the
	// package docs, "Resizing the ring".
	KindResize Kind = 5
	// KindSwitch answers a resize: every data byte its sender wrote before it went to
	// the old ring, every byte after it goes to the new one.
	KindSwitch Kind = 6
	// KindPlace is a message of direct placement: an advertisement of a reader's
	// buffer, the bytes placed into it, or the answers that end one. [Imm].Op says
	// which. See the package docs, "Direct placement".
	KindPlace Kind = 7
)

// PlaceOp is the operation of a placement message (KindPlace).
type PlaceOp uint8

// The placement operations.
const (
	// PlaceAdvert advertises a buffer of the receiver's application: its AdvertLen-byte
	// payload, which the engine defines (where the buffer is, its key, and the stream
	// cursor it continues), goes to the peer's mailbox; the immediate carries the
	// buffer's length in PlaceUnits.
	PlaceAdvert PlaceOp = 0
	// PlacePlaced carries the next bytes of the stream, written into the advertised
	// buffer from its start; the completion's byte length is how many.
	PlacePlaced PlaceOp = 1
	// PlaceDecline tells the advertiser that its advertisement will not be used.
	PlaceDecline PlaceOp = 2
	// PlaceCancel asks the writer to answer the advertisement now.
	PlaceCancel PlaceOp = 3
)

func (o PlaceOp) String() string {
	switch o {
	case PlaceAdvert:
		return "advert"
	case PlacePlaced:
		return "placed"
	case PlaceDecline:
		return "decline"
	case PlaceCancel:
		return "cancel"
	}
	return fmt.Sprintf("PlaceOp(%d)", uint8(o))
}

// Placement limits.
const (
	// AdvertLen is the payload length of an advertisement.
	AdvertLen = 16
	// PlaceUnit is the granularity of an advertised length: 4 KiB.
	PlaceUnit = 4 << 10
	// MaxPlaceLen is the longest buffer one advertisement can name: just under 1 GiB.
	MaxPlaceLen = placeUnitsMask * PlaceUnit
)

// ResizeLen is the payload length of a resize message.
const ResizeLen = 16

// maxRingLog2 is log2 of MaxRingSize: the largest RingLog2 a resize may carry.
const maxRingLog2 = 30

func (k Kind) String() string {
	switch k {
	case KindData:
		return "data"
	case KindCredit:
		return "credit"
	case KindFIN:
		return "fin"
	case KindKeepalive:
		return "keepalive"
	case KindResize:
		return "resize"
	case KindSwitch:
		return "switch"
	case KindPlace:
		return "place"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Limits of the immediate's credit fields.
const (
	// MaxImmWQECredits is the most WQE credits one immediate can return. More are
	// returned by later messages; [Endpoint] does this by itself.
	MaxImmWQECredits = 1<<9 - 1
	// MaxImmRingCredits is the most ring units one immediate can return. A ring holds
	// at most 2^19 units (see [RingUnit]), so half a ring always fits in one message.
	MaxImmRingCredits = 1<<20 - 1
)

// Field positions.
const (
	kindShift = 29
	wqeShift  = 20
	wqeMask   = MaxImmWQECredits
	ringMask  = MaxImmRingCredits

	placeOpShift   = 18
	placeUnitsMask = 1<<placeOpShift - 1
)

// Imm is a decoded immediate.
type Imm struct {
	Kind        Kind
	WQECredits  uint32  // at most MaxImmWQECredits
	RingCredits uint32  // in ring units of the message sender's ring; at most MaxImmRingCredits; zero in a resize
	RingLog2    uint8   // KindResize only: log2 of the new ring's size, at most 30
	Op          PlaceOp // KindPlace only: the placement operation
	PlaceUnits  uint32  // KindPlace with PlaceAdvert only: the buffer's length in PlaceUnits
}

// Encode packs m into an immediate. It fails with [ErrMalformed] when the kind is not
// one of the seven kinds, a credit field is larger than its width, a resize carries ring
// credits or a RingLog2 above 30 (or another kind a RingLog2), or a placement message
// carries ring credits, an unknown operation, or a length that is zero in an
// advertisement, too large for the field, or present in another operation (or another
// kind a placement field).
func (m Imm) Encode() (uint32, error) {
	if m.Kind < KindData || m.Kind > KindPlace {
		return 0, fmt.Errorf("%w: kind %d", ErrMalformed, m.Kind)
	}
	if m.Kind == KindPlace {
		if m.RingCredits != 0 || m.Op > PlaceCancel || (m.Op == PlaceAdvert) != (m.PlaceUnits != 0) || m.PlaceUnits > placeUnitsMask {
			return 0, fmt.Errorf("%w: %v placement of %d units with %d ring credits", ErrMalformed, m.Op, m.PlaceUnits, m.RingCredits)
		}
	} else if m.Op != 0 || m.PlaceUnits != 0 {
		return 0, fmt.Errorf("%w: %v message with a placement operation", ErrMalformed, m.Kind)
	}
	if m.Kind == KindResize && (m.RingCredits != 0 || m.RingLog2 > maxRingLog2) {
		return 0, fmt.Errorf("%w: resize with %d ring credits to 2^%d bytes", ErrMalformed, m.RingCredits, m.RingLog2)
	}
	if m.Kind != KindResize && m.RingLog2 != 0 {
		return 0, fmt.Errorf("%w: %v message with a ring size", ErrMalformed, m.Kind)
	}
	if m.WQECredits > MaxImmWQECredits {
		return 0, fmt.Errorf("%w: %d WQE credits, at most %d fit", ErrMalformed, m.WQECredits, MaxImmWQECredits)
	}
	if m.RingCredits > MaxImmRingCredits {
		return 0, fmt.Errorf("%w: %d ring credits, at most %d fit", ErrMalformed, m.RingCredits, MaxImmRingCredits)
	}
	return m.pack(), nil
}

// pack is Encode for values already known to be in range.
func (m Imm) pack() uint32 {
	return uint32(m.Kind)<<kindShift | m.WQECredits<<wqeShift | m.RingCredits | uint32(m.RingLog2) |
		uint32(m.Op)<<placeOpShift | m.PlaceUnits
}

// DecodeImm unpacks the immediate of a receive completion whose byte length was byteLen.
// It fails with [ErrMalformed] for an unknown kind, a data message of zero bytes, a
// resize that is not ResizeLen bytes or names a ring above 2^30 bytes, a placement
// message whose length does not match its operation (an advertisement of AdvertLen
// bytes naming a length, placed bytes, a decline or a cancel of none, none of the last
// three with a length in the immediate), or another control message (credit, FIN,
// keepalive, switch) that carries bytes.
func DecodeImm(imm, byteLen uint32) (Imm, error) {
	kind, wqes, ring, ringLog2, op, units, ok := decodeImm(imm, byteLen)
	if !ok {
		return Imm{}, malformedImm(imm, byteLen)
	}
	return Imm{Kind: kind, WQECredits: wqes, RingCredits: ring, RingLog2: ringLog2, Op: op, PlaceUnits: units}, nil
}

// decodeImm is DecodeImm with the Imm's fields as results, and ok for no error: what
// every arrival runs (Endpoint.OnArrival). An Imm, built field by field and copied
// whole, stalled the copy's wide loads on its fields' narrow stores: 15 ns a
// DecodeImm against 5–6 ns with the Imm built once at the return (BenchmarkDecodeImm),
// and OnArrival, which kept the result as an Imm, paid the same stall for its copy.
func decodeImm(imm, byteLen uint32) (kind Kind, wqes, ring uint32, ringLog2 uint8, op PlaceOp, units uint32, ok bool) {
	kind, wqes, ring = Kind(imm>>kindShift), imm>>wqeShift&wqeMask, imm&ringMask
	switch kind {
	case KindData:
		ok = byteLen != 0
	case KindResize:
		ok = byteLen == ResizeLen && ring <= maxRingLog2
		ringLog2, ring = uint8(ring), 0
	case KindPlace:
		op, units, ring = PlaceOp(ring>>placeOpShift), ring&placeUnitsMask, 0
		switch op {
		case PlaceAdvert:
			ok = byteLen == AdvertLen && units != 0
		case PlacePlaced:
			ok = byteLen != 0 && units == 0
		default: // decline, cancel
			ok = byteLen == 0 && units == 0
		}
	case KindCredit, KindFIN, KindKeepalive, KindSwitch:
		ok = byteLen == 0
	}
	return kind, wqes, ring, ringLog2, op, units, ok
}

// malformedImm is the error for an immediate decodeImm refused.
func malformedImm(imm, byteLen uint32) error {
	kind, ring := Kind(imm>>kindShift), imm&ringMask
	switch kind {
	case KindData:
		return fmt.Errorf("%w: data message of zero bytes (imm %#08x)", ErrMalformed, imm)
	case KindResize:
		return fmt.Errorf("%w: resize of %d bytes to 2^%d bytes (imm %#08x)", ErrMalformed, byteLen, ring, imm)
	case KindPlace:
		op, units := PlaceOp(ring>>placeOpShift), ring&placeUnitsMask
		return fmt.Errorf("%w: %v placement of %d bytes naming %d units (imm %#08x)", ErrMalformed, op, byteLen, units, imm)
	case KindCredit, KindFIN, KindKeepalive, KindSwitch:
		return fmt.Errorf("%w: %v message carries %d bytes (imm %#08x)", ErrMalformed, kind, byteLen, imm)
	}
	return fmt.Errorf("%w: unknown kind %d (imm %#08x)", ErrMalformed, kind, imm)
}
