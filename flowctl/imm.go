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
//	kind          1 data, 2 credit update, 3 FIN, 4 keepalive; 0 and 5 to 7 are malformed.
//	WQE credits   receive WQEs the sender of this message has re-posted since it last
//	              said so: the reader may send that many more messages.
//	ring credits  bytes of the sender's receive ring its application has consumed since it
//	              last said so, in ring units (see [RingUnit]): the reader may write that
//	              much further into the ring.
//
// The payload length is not in the immediate: it is the completion's byte length, which
// the hardware reports exactly. A data message has a length of at least one byte; the
// other kinds have none. Every kind carries credits, so credit piggybacks on whatever
// traffic flows the other way.

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
)

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
)

// Imm is a decoded immediate.
type Imm struct {
	Kind        Kind
	WQECredits  uint32 // at most MaxImmWQECredits
	RingCredits uint32 // in ring units of the message sender's ring; at most MaxImmRingCredits
}

// Encode packs m into an immediate. It fails with [ErrMalformed] when the kind is not
// one of the four kinds or a credit field is larger than its width.
func (m Imm) Encode() (uint32, error) {
	if m.Kind < KindData || m.Kind > KindKeepalive {
		return 0, fmt.Errorf("%w: kind %d", ErrMalformed, m.Kind)
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
	return uint32(m.Kind)<<kindShift | m.WQECredits<<wqeShift | m.RingCredits
}

// DecodeImm unpacks the immediate of a receive completion whose byte length was byteLen.
// It fails with [ErrMalformed] for an unknown kind, a data message of zero bytes, or a
// control message (credit, FIN, keepalive) that carries bytes.
func DecodeImm(imm, byteLen uint32) (Imm, error) {
	m := Imm{
		Kind:        Kind(imm >> kindShift),
		WQECredits:  imm >> wqeShift & wqeMask,
		RingCredits: imm & ringMask,
	}
	switch m.Kind {
	case KindData:
		if byteLen == 0 {
			return Imm{}, fmt.Errorf("%w: data message of zero bytes (imm %#08x)", ErrMalformed, imm)
		}
	case KindCredit, KindFIN, KindKeepalive:
		if byteLen != 0 {
			return Imm{}, fmt.Errorf("%w: %v message carries %d bytes (imm %#08x)", ErrMalformed, m.Kind, byteLen, imm)
		}
	default:
		return Imm{}, fmt.Errorf("%w: unknown kind %d (imm %#08x)", ErrMalformed, m.Kind, imm)
	}
	return m, nil
}
