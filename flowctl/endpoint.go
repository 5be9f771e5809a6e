package flowctl

import (
	"errors"
	"fmt"
	"math/bits"
)

// Limits on [Params].
const (
	// MinRingSize is the smallest receive ring: 4 KiB.
	MinRingSize = 4 << 10
	// MaxRingSize is the largest receive ring: 1 GiB. Rings above 512 KiB return ring
	// credit in units larger than a byte (see [RingUnit]).
	MaxRingSize = 1 << 30
	// MinRecvWQEs is the fewest receive WQEs a side may pre-post. Below four, the
	// reserve and the update threshold could not both hold (see the package docs).
	MinRecvWQEs = 4
	// MaxRecvWQEs is the most receive WQEs a side may pre-post.
	MaxRecvWQEs = 1 << 15
	// ReservedCredits is how many of the peer's receive WQEs application data may never
	// use: they are kept for credit updates and FIN.
	ReservedCredits = 2
)

// ringUnitsLog2 bounds a ring to 2^19 credit units, so that a full ring's worth of
// credit, and certainly the half ring that triggers an update, fits in the 20-bit field.
const ringUnitsLog2 = 19

// Errors. Every error [Endpoint.OnArrival] returns wraps one of ErrMalformed,
// ErrRingOverrun, ErrWQEOverrun, ErrCreditOverflow, ErrAfterFIN, ErrBadResize or
// ErrBadPlace: the peer
// broke the protocol, and the connection should be closed with that error.
var (
	// ErrBadParams reports ring or WQE parameters out of range.
	ErrBadParams = errors.New("flowctl: invalid parameters")
	// ErrMalformed reports an immediate that does not decode, or whose kind does not
	// match the completion's byte length.
	ErrMalformed = errors.New("flowctl: malformed message")
	// ErrRingOverrun reports a peer that wrote past the ring space it was granted:
	// it may have overwritten bytes the application had not read.
	ErrRingOverrun = errors.New("flowctl: peer wrote past granted ring space")
	// ErrWQEOverrun reports a peer that sent more messages than it was granted
	// receive WQEs.
	ErrWQEOverrun = errors.New("flowctl: peer sent more messages than granted WQEs")
	// ErrCreditOverflow reports a peer that returned credit for bytes or messages
	// that were never sent to it.
	ErrCreditOverflow = errors.New("flowctl: peer returned more credit than was used")
	// ErrAfterFIN reports data or a second FIN after the peer's FIN.
	ErrAfterFIN = errors.New("flowctl: peer sent after FIN")
	// ErrBadResize reports a resize to a ring out of range or of another credit unit,
	// a second resize before this side switched, or a switch nobody asked for.
	ErrBadResize = errors.New("flowctl: invalid ring resize")
	// ErrBadPlace reports a placement message out of turn: an advertisement while the
	// last one is unanswered or naming a cursor this side never wrote, bytes placed
	// into a buffer that was not advertised, is no longer usable or is too small, or an
	// answer to no advertisement.
	ErrBadPlace = errors.New("flowctl: invalid direct placement")
	// ErrPlaceBusy reports Advertise while bytes are buffered, an advertisement is
	// under way, or after the peer's FIN.
	ErrPlaceBusy = errors.New("flowctl: direct placement not possible now")
	// ErrResizeBusy reports Resize while a resize is under way (announced and not
	// switched, or the old ring still holding bytes) or after the peer's FIN.
	ErrResizeBusy = errors.New("flowctl: ring resize under way")
	// ErrWriteClosed reports ReserveData after CloseWrite.
	ErrWriteClosed = errors.New("flowctl: write after CloseWrite")
	// ErrBadLength reports a negative length, or Consume of more than is buffered.
	ErrBadLength = errors.New("flowctl: invalid length")
)

// Params describe one side's receive resources, as exchanged in the connection hello.
type Params struct {
	// RingSize is the size of the receive ring in bytes: a power of two between
	// MinRingSize and MaxRingSize.
	RingSize int
	// RecvWQEs is the number of receive WQEs the side pre-posts and keeps posted:
	// between MinRecvWQEs and MaxRecvWQEs.
	RecvWQEs int
	// UnitRingSize, if not zero, fixes the credit unit of every ring the side will
	// have at RingUnit(UnitRingSize): a power of two from RingSize to MaxRingSize,
	// normally the largest ring it may grow to. Rings above 512 KiB have units of
	// more than a byte, and a resize keeps the unit (see [Endpoint.Resize]), so a ring
	// that is to grow past 512 KiB must start with the unit of its largest size.
	// Zero means RingSize: the unit of the first ring, which every ring up to 512 KiB
	// shares.
	UnitRingSize int
	// GrowWQEsTo, if not zero, is the most receive WQEs the side may come to keep
	// posted by adding to them while the stream runs ([Endpoint.GrowWQEs]): from
	// RecvWQEs to MaxRecvWQEs. Its peer then takes WQE credit beyond the messages it
	// sent, up to the growth this allows, as the new WQEs. Zero means RecvWQEs: the
	// side never grows, and such credit from it is a protocol violation. See the
	// package docs, "Growing the receive queue".
	GrowWQEsTo int
}

// Validate reports whether p is in range, wrapping [ErrBadParams] if not.
func (p Params) Validate() error { return p.validate("") }

// validate is Validate, naming the side (with a trailing space) in the error.
func (p Params) validate(side string) error {
	if p.RingSize < MinRingSize || p.RingSize > MaxRingSize || p.RingSize&(p.RingSize-1) != 0 {
		return fmt.Errorf("%w: %sring size %d is not a power of two in [%d, %d]", ErrBadParams, side, p.RingSize, MinRingSize, MaxRingSize)
	}
	if p.RecvWQEs < MinRecvWQEs || p.RecvWQEs > MaxRecvWQEs {
		return fmt.Errorf("%w: %d %sreceive WQEs, want [%d, %d]", ErrBadParams, p.RecvWQEs, side, MinRecvWQEs, MaxRecvWQEs)
	}
	if u := p.UnitRingSize; u != 0 && (u < p.RingSize || u > MaxRingSize || u&(u-1) != 0) {
		return fmt.Errorf("%w: %sunit ring size %d is not a power of two in [%d, %d]", ErrBadParams, side, u, p.RingSize, MaxRingSize)
	}
	if g := p.GrowWQEsTo; g != 0 && (g < p.RecvWQEs || g > MaxRecvWQEs) {
		return fmt.Errorf("%w: %sreceive WQEs grow to %d, want [%d, %d]", ErrBadParams, side, g, p.RecvWQEs, MaxRecvWQEs)
	}
	return nil
}

// maxWQEs is the most receive WQEs the side may keep posted.
func (p Params) maxWQEs() uint64 { return uint64(max(p.RecvWQEs, p.GrowWQEsTo)) }

// unitRing is the ring size whose credit unit the side's rings have.
func (p Params) unitRing() uint64 { return uint64(max(p.RingSize, p.UnitRingSize)) }

// RingUnit is the granularity, in bytes, in which ring credit for a ring of ringSize
// bytes is returned: 1 up to 512 KiB, and ringSize/2^19 above (2 KiB for a 1 GiB ring).
// A receiver returns only whole units, so up to RingUnit-1 consumed bytes wait for the
// next unit to fill before the sender may reuse them. A side whose Params name a
// UnitRingSize has RingUnit(UnitRingSize) for every ring instead.
func RingUnit(ringSize int) int { return 1 << unitShift(uint64(ringSize)) }

func unitShift(ringSize uint64) uint {
	if l := bits.Len64(ringSize) - 1; l > ringUnitsLog2 {
		return uint(l - ringUnitsLog2)
	}
	return 0
}

// Piece is a contiguous range of a ring: Len bytes starting Off bytes from its base.
type Piece struct {
	Off int
	Len int
}

// Msg is one RDMA_WRITE_WITH_IMM to post to the peer: Len bytes (zero for most control
// messages) written at Off in the peer's ring, with immediate Imm. A resize (Kind
// KindResize) and an advertisement (KindPlace, PlaceAdvert) are the exceptions: their
// ResizeLen or AdvertLen bytes go to the peer's mailbox; and placed bytes (KindPlace,
// PlacePlaced) go to the buffer the peer advertised.
type Msg struct {
	Piece
	Imm  uint32
	Kind Kind
}

// Stats counts the messages an Endpoint has handed out and accepted.
type Stats struct {
	DataSent        uint64 // data messages reserved (a write split at the ring's end counts twice)
	ControlSent     uint64 // credit updates, FINs and keepalives handed out
	DataReceived    uint64 // data messages accepted by OnArrival
	ControlReceived uint64 // credit updates, FINs and keepalives accepted by OnArrival
	PlacedSent      uint64 // placements handed out by ReservePlace
	PlacedReceived  uint64 // placements accepted by OnArrival
}

// Endpoint is the flow-control state of one end of an RDMA stream: the send half (the
// peer's ring and receive queue as this side knows them) and the receive half (this
// side's ring and receive queue). The halves share one type because every message
// couples them: it spends send credit and carries receive credit back.
//
// Methods do no I/O and allocate nothing except when returning an error. An Endpoint is
// not safe for concurrent use; the engine holds its connection mutex around every call.
// After OnArrival reports a protocol violation, the error is sticky: OnArrival and
// ReserveData return it and NextControl and Keepalive return nothing.
type Endpoint struct {
	// Send half: cursors into the peer's ring and counts of its receive WQEs.
	peerRing      uint64 // size of the peer's ring, a power of two
	peerUnitShift uint   // log2 of the peer ring's credit unit
	peerUnitRing  uint64 // the peer's Params.UnitRingSize: resizes it announces keep its unit
	peerWQEs      uint64 // receive WQEs the peer keeps posted, as far as its credit shows (see GrowWQEs)
	peerMaxWQEs   uint64 // the most it may grow them to
	prod          uint64 // producer cursor: ring bytes reserved so far
	granted       uint64 // the peer's consumer cursor as last returned: we may write below granted+peerRing
	sent          uint64 // messages of every kind handed out
	wqeLimit      uint64 // peerWQEs plus all WQE credit returned: sent never exceeds it
	finRequested  bool   // CloseWrite was called
	finSent       bool   // the FIN has been handed out
	peerBase      uint64 // producer cursor at which the peer's current ring began
	switchTo      uint64 // size of the ring the peer announced, until the switch is handed out
	switchDue     bool   // a resize arrived and the switch answering it is not handed out

	// Receive half: cursors into our ring and counts of our receive WQEs.
	ring        uint64 // size of our ring, a power of two
	unitShift   uint   // log2 of our ring's credit unit
	unitRing    uint64 // our Params.UnitRingSize: resizes keep its unit
	wqes        uint64 // receive WQEs we keep posted
	maxWQEs     uint64 // the most GrowWQEs may take them to
	grown       uint64 // WQEs GrowWQEs added: owed to the peer as credit like reaped ones
	arrived     uint64 // bytes that have landed in the ring
	consumed    uint64 // bytes the application has consumed
	returned    uint64 // consumer cursor as told to the peer, a whole number of units
	reaped      uint64 // messages received (each re-posted a WQE)
	wqeReturned uint64 // WQE credits told to the peer: at most reaped plus grown
	peerFIN     bool   // the peer's FIN has arrived
	ringBase    uint64 // stream cursor at which our current ring began
	oldRing     uint64 // size of the ring the last switch replaced, while it holds bytes; else 0
	oldBase     uint64 // stream cursor at which the old ring began
	switchAt    uint64 // stream cursor of the last switch: bytes below it are in the old ring
	resizeTo    uint64 // ring size Resize asked for, until the resize is handed out
	resizing    uint64 // ring size announced to the peer, until its switch arrives

	pol   policy
	err   error // sticky protocol violation
	stats Stats

	// Direct placement (place.go), kept apart from the fields every message touches.
	// Send half: the peer's advertisement.
	peerAdvert    uint64 // length of the peer's unanswered advertisement; 0: none
	peerAdvertAt  uint64 // the stream cursor it continues
	peerAdvertNew bool   // it arrived and PeerAdvert has not given its cursor yet
	declineDue    bool   // the peer's advertisement is to be declined
	// Receive half: ours.
	advertStale bool   // data or the FIN arrived since: the peer will not place into it
	cancelDue   bool   // CancelAdvert asked for a cancel that is not handed out
	canceled    bool   // the cancel is asked for or handed out
	advertTo    uint64 // buffer length Advertise asked for, until the advertisement is handed out
	advert      uint64 // length of our unanswered advertisement; 0: none
	advertAt    uint64 // the cursor it continues: arrived when it was handed out
}

// policy holds the tunables of the protocol. NewEndpoint sets them from the package
// constants; the model tests change them to show that the rules are needed.
type policy struct {
	reserve    uint64 // data never takes the peer's last reserve WQE credits
	lastCredit bool   // the very last WQE credit only goes to a message that returns WQE credit
	wqeUpdate  uint64 // owed WQE credits that make a standalone update due
	ringUpdate uint64 // returnable ring bytes that make a standalone update due
	maxWQE     uint64 // WQE credits one immediate may carry
	maxRing    uint64 // ring units one immediate may carry
	spillAt    uint64 // buffered bytes from which Spillable hands them out
	minRing    uint64 // smallest ring a resize may name

	// Rules of resizing the model tests break on purpose.
	keepBase            bool // the sender writes the new ring at its cursor modulo the size, not from its start
	resizeEarly         bool // the receiver takes the new ring when it hands out the resize
	resizeWhileDraining bool // the receiver asks for a new ring while the old one holds bytes
}

// NewEndpoint returns the flow-control state of a connection whose own receive side is
// local and whose peer's is peer. Both must be valid Params.
func NewEndpoint(local, peer Params) (*Endpoint, error) {
	e, err := MakeEndpoint(local, peer)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// MakeEndpoint is [NewEndpoint] returning the state itself, for a connection that keeps
// it inside its own struct rather than behind one more allocation.
func MakeEndpoint(local, peer Params) (Endpoint, error) {
	if err := local.validate("local "); err != nil {
		return Endpoint{}, err
	}
	if err := peer.validate("peer "); err != nil {
		return Endpoint{}, err
	}
	return newEndpoint(local, peer), nil
}

// newEndpoint builds an Endpoint without range checks, so the model tests can use rings
// of a few bytes. Ring sizes must still be powers of two and WQE counts at least one.
func newEndpoint(local, peer Params) Endpoint {
	ring, wqes := uint64(local.RingSize), uint64(local.RecvWQEs)
	return Endpoint{
		peerRing:      uint64(peer.RingSize),
		peerUnitShift: unitShift(peer.unitRing()),
		peerUnitRing:  uint64(peer.UnitRingSize),
		peerWQEs:      uint64(peer.RecvWQEs),
		peerMaxWQEs:   peer.maxWQEs(),
		wqeLimit:      uint64(peer.RecvWQEs),
		ring:          ring,
		unitShift:     unitShift(local.unitRing()),
		unitRing:      uint64(local.UnitRingSize),
		wqes:          wqes,
		maxWQEs:       local.maxWQEs(),
		pol: policy{
			reserve:    ReservedCredits,
			lastCredit: true,
			wqeUpdate:  min(wqes/2, MaxImmWQECredits),
			ringUpdate: ring / 2,
			maxWQE:     MaxImmWQECredits,
			maxRing:    MaxImmRingCredits,
			spillAt:    ring / 2,
			minRing:    MinRingSize,
		},
	}
}

// Err returns the protocol violation OnArrival reported, or nil.
func (e *Endpoint) Err() error { return e.err }

// Stats returns message counts since the Endpoint was created.
func (e *Endpoint) Stats() Stats { return e.stats }

// fail records a protocol violation; it is returned from then on.
func (e *Endpoint) fail(err error) (Arrival, error) {
	e.err = err
	return Arrival{}, err
}
