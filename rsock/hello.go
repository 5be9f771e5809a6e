package rsock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// The hello is the first message on every rsock connection, in each direction: the
// client's offer, then the server's answer. This file holds its wire format, encoder,
// decoder and stream reader; hello_test.go fuzzes the decoder.
//
// All integers are big-endian. Every hello starts with a header that no version of the
// protocol will change, so that any version can recognize, frame and skip any other's:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------+---------------+---------------+---------------+
//	|     0x89      |      'R'      |      'S'      |      'K'      |  magic
//	+---------------+---------------+---------------+---------------+
//	|    Version    |     Kind      |          Body Length          |
//	+---------------+---------------+-------------------------------+
//	|                 Body (Body Length bytes) ...
//	+---------------------------------------------------------------+
//
// The magic's first byte has its high bit set and is no printable character, so no text
// protocol, TLS record or HTTP/2 preface starts with it. A whole hello, header included,
// is at most helloMaxLen (512) bytes. Kind is 1 for an offer (client to server), 2 for
// an accept and 3 for a decline (server to client); kinds keep these numbers in every
// version, and a decline's body starts with its reason in every version.
//
// In version 2, an offer's and an accept's body is:
//
//	+---------------------------------------------------------------+
//	|                      Capabilities (32)                        |
//	+---------------------------------------------------------------+
//	|       RDMA endpoint (52 bytes), present iff bit 0 is set      |
//	+---------------------------------------------------------------+
//
// Bit 0 of Capabilities (capRDMA) says the sender offers RDMA and describes its endpoint;
// bit 1 (capSHM, with bit 0 only) says that endpoint is on the same-host shared-memory
// transport (shm.go); bit 2 (capPlace, with bit 0 only) says the sender's engine takes
// part in direct placement (rdma's place.go), which a connection uses when both
// sides say so; other bits are reserved, sent as zero and ignored. An accept always
// has bit 0 set.
// The RDMA endpoint is what the peer needs to connect its queue pair to the sender's,
// and a nonce that binds the proof (proof.go) to this bootstrap connection:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------------------------------------------------------+
//	|                                                               |
//	+                                                               +
//	|                  GID (128): the port's GID                    |
//	+                  (RoCE v2: its IP address)                    +
//	|                                                               |
//	+-------------------------------+---------------+---------------+
//	|            LID (16)           |   MTU (8)     |  Ring Log2 (8)|
//	+---------------+---------------+---------------+---------------+
//	|       0       |                QPN (24)                       |
//	+---------------+-----------------------------------------------+
//	|       0       |             first PSN (24)                    |
//	+---------------+-----------------------------------------------+
//	|       Receive WQEs (32): pre-posted, the peer's WQE credits   |
//	+---------------------------------------------------------------+
//	|                     Max Inline (32)                           |
//	+---------------------------------------------------------------+
//	|                                                               |
//	+                                                               +
//	|                 Nonce (128): random, fresh per hello          |
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//
// MTU is the port's active MTU as [verbs.MTU] numbers it (1 = 256 bytes to 5 = 4096).
// The ring is 1<<(Ring Log2) bytes, from 4 KiB (12) to 1 GiB (30). QPN is non-zero;
// QPN and PSN are 24-bit numbers whose top byte is zero. Receive WQEs is at least 1.
//
// One byte may follow the endpoint, appended within version 2:
//
//	+---------------+
//	|Unit Ring Log2 |
//	+---------------+
//
// It is log2 of the ring size whose ring-credit unit every ring of the sender has
// (flowctl's Params.UnitRingSize: the largest ring it may grow to), from Ring Log2 to
// 30. Rings above 512 KiB have units of more than a byte, and a ring keeps its unit
// when it is resized, so a ring that is to grow past 512 KiB takes the unit of its
// largest size from the start, which its peer must know. A side uses it only when the
// peer's hello carries the byte too, so that the peer understands it: toward a peer
// whose hello ends with the endpoint (from before the byte), each ring's unit is
// that of its size, and rings grow to 512 KiB at most.
//
// Four more bytes may follow that byte, appended within version 2 (a hello that has
// them has the byte):
//
//	+---------------------------------------------------------------+
//	|               Grow Receive WQEs To (32)                       |
//	+---------------------------------------------------------------+
//
// It is the most receive WQEs the sender may come to keep posted (flowctl's
// Params.GrowWQEsTo), from Receive WQEs to 32,768: equal to Receive WQEs when its queue
// does not grow. Its presence also says that the sender takes WQE credit beyond the
// messages it sent, up to the growth the peer's hello names, as WQEs the peer added.
// A side grows its receive queue only toward a peer whose hello carries the field.
//
// The ring's address and rkey are not in the hello (version 1 carried them): they
// travel only in the proof, over the new queue pairs, once the peer has shown it holds
// this connection's nonces (see upgrade.go). A party that sees or replays the bootstrap
// bytes never learns a ring's key.
//
// In version 2, as in 1, a decline's body is one byte, the reason (see declineReason); zero is
// not a reason. A reason the receiver does not know is accepted as "upgrade failed".
//
// A decoder rejects, with an error matching [ErrNotRsockPeer], input that does not start
// with the magic; with [ErrVersionMismatch] a version other than its own (after framing
// it, so that the reader can skip it); and with [ErrBadHello] an oversized body, an
// unknown kind, a body shorter than its kind needs, or a field out of range. A body
// longer than its kind needs is accepted and the rest ignored: fields are only ever
// appended within a version; incompatible changes take a new version.
//
// The exchange: the client sends an offer. A client that offers no RDMA may send data
// right behind it. A client about to prepare an RDMA endpoint sends the offer's magic
// first and the rest once its endpoint is ready (the same bytes, in two writes), so that
// a server sniffing for plain clients recognizes it however slow its device is. The server answers with an accept or a decline. After a decline both
// sides stay on the bootstrap connection, whose next bytes are data. After an accept,
// the two sides prove the path over the new queue pairs and the client confirms with
// one byte (upgrade.go). A server that receives another version's offer (version 1's
// included) answers with a decline (reason version mismatch) in its own version, and
// both stay on the bootstrap connection; a client that receives another version's
// answer falls back likewise, or fails when it cannot frame it.

const (
	helloVersion    = 2
	helloHeaderLen  = 8
	helloMaxLen     = 512
	helloMaxBody    = helloMaxLen - helloHeaderLen
	helloCapsLen    = 4
	rdmaEndpointLen = 52
	unitRingLen     = 1 // the optional byte after the endpoint
	growWQEsLen     = 4 // the optional field after that byte
	nonceLen        = 16
	minRingLog2     = 12
	maxRingLog2     = 30
	max24           = 1<<24 - 1
)

var helloMagic = [4]byte{0x89, 'R', 'S', 'K'}

// helloKind is what a hello says: an offer, or one of the two answers.
type helloKind uint8

const (
	helloOffer   helloKind = 1
	helloAccept  helloKind = 2
	helloDecline helloKind = 3
)

func (k helloKind) String() string {
	switch k {
	case helloOffer:
		return "offer"
	case helloAccept:
		return "accept"
	case helloDecline:
		return "decline"
	}
	return fmt.Sprintf("kind %d", uint8(k))
}

// helloCaps are the capability bits of an offer or accept.
type helloCaps uint32

const capRDMA helloCaps = 1 << 0

// capPlace, in an offer or accept that has capRDMA, says that the sender's engine can
// take part in direct placement: a large Read's buffer written by the peer's device.
// An accept says so only when the offer did.
const capPlace helloCaps = 1 << 2

// nonce is a hello's random number, fresh for each hello, that the peer's proof must
// echo (proof.go).
type nonce [nonceLen]byte

// rdmaEndpoint is one side's RDMA endpoint as the hello carries it: the RDMA engine's
// offer without its ring's address and key, which go in the proof, and with a nonce.
type rdmaEndpoint struct {
	GID       verbs.GID
	LID       uint16
	MTU       verbs.MTU // active MTU of the port
	QPN       uint32    // 24 bits, non-zero
	PSN       uint32    // first send PSN, 24 bits
	RingSize  uint32    // a power of two
	RecvWQEs  uint32    // receive WQEs kept posted: the peer's initial WQE credits
	MaxInline uint32
	Nonce     nonce
	// UnitRingSize is the ring whose credit unit every ring of the sender has, a
	// power of two of at least RingSize; zero when the hello did not carry it.
	UnitRingSize uint32
	// GrowRecvWQEsTo is the most receive WQEs the sender may come to keep posted, at
	// least RecvWQEs; zero when the hello did not carry it. It is sent only with
	// UnitRingSize.
	GrowRecvWQEsTo uint32
}

// hello is one decoded hello message.
type hello struct {
	version uint8
	kind    helloKind
	caps    helloCaps     // offer, accept
	rdma    rdmaEndpoint  // offer, accept: valid iff caps has capRDMA
	reason  declineReason // decline
}

// offerHello is a client's offer; rdma is nil when it offers no RDMA.
func offerHello(rdma *rdmaEndpoint) hello {
	h := hello{version: helloVersion, kind: helloOffer}
	if rdma != nil {
		h.caps, h.rdma = capRDMA, *rdma
	}
	return h
}

// acceptHello is a server's accept, carrying its own RDMA endpoint.
func acceptHello(rdma rdmaEndpoint) hello {
	return hello{version: helloVersion, kind: helloAccept, caps: capRDMA, rdma: rdma}
}

// declineHello is a server's decline for reason r.
func declineHello(r declineReason) hello {
	return hello{version: helloVersion, kind: helloDecline, reason: r}
}

// offersRDMA reports whether an offer or accept carries an RDMA endpoint.
func (h hello) offersRDMA() bool { return h.caps&capRDMA != 0 }

// appendTo appends the encoded hello to b. The RDMA endpoint's RingSize must be a power
// of two.
func (h hello) appendTo(b []byte) []byte {
	b = append(b, helloMagic[:]...)
	b = append(b, h.version, byte(h.kind), 0, 0)
	start := len(b)
	switch h.kind {
	case helloOffer, helloAccept:
		b = binary.BigEndian.AppendUint32(b, uint32(h.caps))
		if h.offersRDMA() {
			b = h.rdma.appendTo(b)
		}
	case helloDecline:
		b = append(b, byte(h.reason))
	}
	binary.BigEndian.PutUint16(b[start-2:start], uint16(len(b)-start))
	return b
}

func (e *rdmaEndpoint) appendTo(b []byte) []byte {
	b = append(b, e.GID[:]...)
	b = binary.BigEndian.AppendUint16(b, e.LID)
	b = append(b, byte(e.MTU), byte(bits.TrailingZeros32(e.RingSize)))
	b = binary.BigEndian.AppendUint32(b, e.QPN)
	b = binary.BigEndian.AppendUint32(b, e.PSN)
	b = binary.BigEndian.AppendUint32(b, e.RecvWQEs)
	b = binary.BigEndian.AppendUint32(b, e.MaxInline)
	b = append(b, e.Nonce[:]...)
	if e.UnitRingSize != 0 {
		b = append(b, byte(bits.TrailingZeros32(e.UnitRingSize)))
		if e.GrowRecvWQEsTo != 0 {
			b = binary.BigEndian.AppendUint32(b, e.GrowRecvWQEsTo)
		}
	}
	return b
}

// helloNeed reports how many more bytes complete the hello whose first bytes are b, or
// an error as soon as b cannot start a valid hello. It never asks for more than
// helloMaxLen bytes in all.
func helloNeed(b []byte) (int, error) {
	m := min(len(b), len(helloMagic))
	if !bytes.Equal(b[:m], helloMagic[:m]) {
		return 0, fmt.Errorf("%w: first bytes %q are not an rsock hello", ErrNotRsockPeer, b[:m])
	}
	if len(b) < helloHeaderLen {
		return helloHeaderLen - len(b), nil
	}
	n := int(binary.BigEndian.Uint16(b[6:8]))
	if n > helloMaxBody {
		return 0, fmt.Errorf("%w: body of %d bytes exceeds the maximum of %d", ErrBadHello, n, helloMaxBody)
	}
	return max(helloHeaderLen+n-len(b), 0), nil
}

// decodeHello decodes the hello at the start of b and returns it with the number of
// bytes it took. For a hello of another version it returns an error matching
// ErrVersionMismatch together with the hello's version, kind, length and, for a
// decline, its reason, so that the caller can skip it and answer.
func decodeHello(b []byte) (hello, int, error) {
	need, err := helloNeed(b)
	if err != nil {
		return hello{}, 0, err
	}
	if need > 0 {
		return hello{}, 0, fmt.Errorf("%w: truncated: %d bytes, %d more needed", ErrBadHello, len(b), need)
	}
	n := helloHeaderLen + int(binary.BigEndian.Uint16(b[6:8]))
	h := hello{version: b[4], kind: helloKind(b[5])}
	body := b[helloHeaderLen:n]
	if h.version != helloVersion {
		if h.kind == helloDecline && len(body) > 0 {
			h.reason = declineReason(body[0])
		}
		return h, n, fmt.Errorf("%w: peer speaks version %d, this side %d", ErrVersionMismatch, h.version, helloVersion)
	}
	switch h.kind {
	case helloOffer, helloAccept:
		if len(body) < helloCapsLen {
			return hello{}, 0, fmt.Errorf("%w: %v body of %d bytes is shorter than %d", ErrBadHello, h.kind, len(body), helloCapsLen)
		}
		h.caps = helloCaps(binary.BigEndian.Uint32(body))
		h.caps &= capRDMA | capSHM | capPlace // reserved bits are ignored
		if h.caps&capRDMA == 0 {
			h.caps = 0 // capSHM qualifies an RDMA endpoint (shm.go)
		}
		if !h.offersRDMA() {
			if h.kind == helloAccept {
				return hello{}, 0, fmt.Errorf("%w: accept without an RDMA endpoint", ErrBadHello)
			}
			break
		}
		if len(body) < helloCapsLen+rdmaEndpointLen {
			return hello{}, 0, fmt.Errorf("%w: %v body of %d bytes is shorter than %d", ErrBadHello, h.kind, len(body), helloCapsLen+rdmaEndpointLen)
		}
		if h.rdma, err = decodeRDMAEndpoint(body[helloCapsLen:]); err != nil {
			return hello{}, 0, err
		}
		if err = h.rdma.decodeTrailer(body[helloCapsLen+rdmaEndpointLen:]); err != nil {
			return hello{}, 0, err
		}
	case helloDecline:
		if len(body) < 1 {
			return hello{}, 0, fmt.Errorf("%w: decline without a reason", ErrBadHello)
		}
		if h.reason = declineReason(body[0]); h.reason == 0 {
			return hello{}, 0, fmt.Errorf("%w: decline with reason 0", ErrBadHello)
		}
	default:
		return hello{}, 0, fmt.Errorf("%w: unknown kind %d", ErrBadHello, uint8(h.kind))
	}
	return h, n, nil
}

// decodeRDMAEndpoint decodes and range-checks an RDMA endpoint from b, which holds at
// least rdmaEndpointLen bytes.
func decodeRDMAEndpoint(b []byte) (rdmaEndpoint, error) {
	var e rdmaEndpoint
	copy(e.GID[:], b[0:16])
	e.LID = binary.BigEndian.Uint16(b[16:18])
	e.MTU = verbs.MTU(b[18])
	ringLog2 := b[19]
	e.QPN = binary.BigEndian.Uint32(b[20:24])
	e.PSN = binary.BigEndian.Uint32(b[24:28])
	e.RecvWQEs = binary.BigEndian.Uint32(b[28:32])
	e.MaxInline = binary.BigEndian.Uint32(b[32:36])
	copy(e.Nonce[:], b[36:52])
	switch {
	case e.MTU.Bytes() == 0:
		return rdmaEndpoint{}, fmt.Errorf("%w: RDMA MTU code %d", ErrBadHello, b[18])
	case ringLog2 < minRingLog2 || ringLog2 > maxRingLog2:
		return rdmaEndpoint{}, fmt.Errorf("%w: ring size 2^%d is outside 2^%d..2^%d", ErrBadHello, ringLog2, minRingLog2, maxRingLog2)
	case e.QPN == 0 || e.QPN > max24:
		return rdmaEndpoint{}, fmt.Errorf("%w: QPN %#x is not a non-zero 24-bit number", ErrBadHello, e.QPN)
	case e.PSN > max24:
		return rdmaEndpoint{}, fmt.Errorf("%w: PSN %#x is not a 24-bit number", ErrBadHello, e.PSN)
	case e.RecvWQEs == 0:
		return rdmaEndpoint{}, fmt.Errorf("%w: no receive WQEs", ErrBadHello)
	}
	e.RingSize = 1 << ringLog2
	return e, nil
}

// decodeTrailer decodes the optional fields after the endpoint from rest, what follows
// the endpoint in the body: the unit ring's byte, then the receive queue's growth. A
// field the hello lacks stays zero.
func (e *rdmaEndpoint) decodeTrailer(rest []byte) error {
	if len(rest) < unitRingLen {
		return nil
	}
	l := rest[0]
	if l > maxRingLog2 || uint32(1)<<l < e.RingSize {
		return fmt.Errorf("%w: unit ring 2^%d is outside 2^%d..2^%d", ErrBadHello, l, bits.TrailingZeros32(e.RingSize), maxRingLog2)
	}
	e.UnitRingSize = 1 << l
	rest = rest[unitRingLen:]
	if len(rest) < growWQEsLen {
		return nil
	}
	g := binary.BigEndian.Uint32(rest)
	if g < e.RecvWQEs || g > flowctl.MaxRecvWQEs {
		return fmt.Errorf("%w: receive WQEs grow from %d to %d, want at most %d", ErrBadHello, e.RecvWQEs, g, flowctl.MaxRecvWQEs)
	}
	e.GrowRecvWQEsTo = g
	return nil
}

// helloReader reads one hello from a stream, taking exactly its bytes so that the data
// behind it stays in the stream. A read that fails with an I/O error (a deadline, say)
// can be resumed by calling read again; an error matching ErrNotRsockPeer or
// ErrBadHello is final.
type helloReader struct {
	buf [helloMaxLen]byte
	n   int
}

// read reads the rest of the hello from r and decodes it.
func (hr *helloReader) read(r io.Reader) (hello, error) {
	for {
		need, err := helloNeed(hr.buf[:hr.n])
		if err != nil {
			return hello{}, err
		}
		if need == 0 {
			h, _, err := decodeHello(hr.buf[:hr.n])
			return h, err
		}
		m, err := r.Read(hr.buf[hr.n : hr.n+need])
		hr.n += m
		if err == nil || m == need {
			continue
		}
		if err == io.EOF {
			if hr.n == 0 {
				return hello{}, fmt.Errorf("%w: connection closed before its hello: %w", ErrNotRsockPeer, io.ErrUnexpectedEOF)
			}
			if _, err := helloNeed(hr.buf[:hr.n]); err != nil {
				return hello{}, err
			}
			return hello{}, fmt.Errorf("%w: truncated: connection closed after %d bytes: %w", ErrBadHello, hr.n, io.ErrUnexpectedEOF)
		}
		return hello{}, err
	}
}

// final reports whether err, returned by helloReader.read, ends the handshake rather
// than interrupting it.
func helloErrFinal(err error) bool {
	return errors.Is(err, ErrNotRsockPeer) || errors.Is(err, ErrBadHello) || errors.Is(err, ErrVersionMismatch)
}

// writeHello encodes h and writes it to w in one Write.
func writeHello(w io.Writer, h hello) error {
	buf := helloBufs.Get().(*[helloMaxLen]byte)
	_, err := w.Write(h.appendTo(buf[:0]))
	helloBufs.Put(buf)
	return err
}

// helloBufs holds writeHello's buffers. A buffer on writeHello's stack would escape
// through w, an interface, and cost every handshake an allocation.
var helloBufs = sync.Pool{New: func() any { return new([helloMaxLen]byte) }}

// declineReason is why a server declines an upgrade, as the hello carries it.
type declineReason uint8

const (
	declineNoProvider declineReason = iota + 1
	declineNoDevice
	declinePeerOfferedNone
	declineVersionMismatch
	declineResourcesExhausted
	declineMTUMismatch
	declineNoRoute
	declineUnavailable
	declineFailed
)

// declineErrs maps each reason to the sentinel error it stands for.
var declineErrs = [...]error{
	declineNoProvider:         ErrNoProvider,
	declineNoDevice:           ErrNoDevice,
	declinePeerOfferedNone:    ErrPeerOfferedNone,
	declineVersionMismatch:    ErrVersionMismatch,
	declineResourcesExhausted: ErrResourcesExhausted,
	declineMTUMismatch:        ErrMTUMismatch,
	declineNoRoute:            ErrNoRoute,
	declineUnavailable:        ErrRDMAUnavailable,
	declineFailed:             ErrUpgradeFailed,
}

// err returns the sentinel error for r; a reason this version does not know (a newer
// peer's) is reported as ErrUpgradeFailed.
func (r declineReason) err() error {
	if r != 0 && int(r) < len(declineErrs) {
		return declineErrs[r]
	}
	return fmt.Errorf("%w (reason %d)", ErrUpgradeFailed, uint8(r))
}

// declineReasonOf returns the reason to send for a fallback error.
func declineReasonOf(err error) declineReason {
	for r := declineNoProvider; int(r) < len(declineErrs); r++ {
		if errors.Is(err, declineErrs[r]) {
			return r
		}
	}
	return declineFailed
}
