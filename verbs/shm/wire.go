package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The wire: every message between two shm QPs is little endian, its kind in the first
// byte. A requester QP dials the responder's socket (SOCK_SEQPACKET) and opens with a
// hello datagram that carries the connection's channel (channel.go), a memfd, as
// SCM_RIGHTS. From then on requests and region queries are records in the channel's
// request ring, pipelined, and the responder answers each, in order: a response record
// in the response ring, or a region datagram on the socket (it passes a descriptor).
// Besides the hello and regions, the socket carries only doorbells, which wake a
// sleeping consumer of a ring, and the end of the connection.
//
//	hello (requester → responder), 32 bytes, with the channel's memfd:
//	+------+---------+-------+-----------+-----------+-------------------+
//	| 1 u8 | ver u8  | 0 u16 | magic u32 | srcQPN u32| dstQPN u32 | srcGID [16] |
//	+------+---------+-------+-----------+-----------+-------------------+
//
//	request (requester → responder), 28 bytes + SEND payload; flags: 1 solicited, 2 notify:
//	+------+-------+----------+------+---------+----------+------------+-----------+---------+---------+
//	| 2 u8 | op u8 | flags u8 | 0 u8 | imm u32 | rkey u32 | length u32 | raddr u64 | psn u32 | payload |
//	+------+-------+----------+------+---------+----------+------------+-----------+---------+---------+
//
// The PSN (24 bits) numbers requests, one per request, from the requester's SQPSN: the
// responder executes the one it expects (its RQPSN onwards), acknowledges again without
// executing one it already executed (a retransmission whose first answer was late), and
// drops one from the future.
//
//	region query (requester → responder), 8 bytes: | 3 u8 | 0 [3] | rkey u32 |
//
//	response (responder → requester), 8 bytes:
//	| 4 u8 | kind u8 | rnrTimer u8 | 0 u8 | wc status u32 |
//
//	region (responder → requester), 32 bytes, with the region's memfd as SCM_RIGHTS when ok:
//	| 5 u8 | ok u8 | 0 u16 | rkey u32 | access u32 | 0 u32 | addr u64 | length u64 |
//
//	doorbell (either way, on the socket), 1 byte: | 6 u8 |
//
// Payload bytes of RDMA WRITE and READ never travel here: they are copied straight
// between the requester's memory and the responder's region, which the requester maps.
// Every field is checked on decoding; a message that fails a check ends the connection.

const (
	msgHello    = 1
	msgRequest  = 2
	msgMRQuery  = 3
	msgResponse = 4
	msgRegion   = 5
	msgDoorbell = 6

	wireVersion = 2
	wireMagic   = 0x4d485352 // "RSHM"

	helloLen    = 32
	requestLen  = 28
	mrQueryLen  = 8
	responseLen = 8
	regionLen   = 32
	doorbellLen = 1

	// maxSendPayload is the largest SEND: its payload travels in the request record,
	// which must fit the request ring.
	maxSendPayload = 64 << 10
	maxMsg         = requestLen + maxSendPayload
)

// Response kinds.
const (
	respAck  = 1 // executed
	respRNR  = 2 // no receive WQE: retry after the RNR timer
	respDrop = 3 // the responder does not take requests from this requester now: lost
	respErr  = 4 // executed in error: status says which, both QPs go to ERROR
)

// Flag bits of a request: the SEND or WRITE_WITH_IMM is solicited; the requester wants
// its response at once (it completes a signaled WR, or the requester needs room), so
// the responder rings its doorbell if it sleeps. Other acknowledgements wait in the
// response ring for the requester's next look, saving it a wake-up.
const (
	reqSolicited = 1
	reqNotify    = 2
)

var errMalformed = errors.New("shm: malformed message")

// msg is one decoded message. Only the fields of its kind are meaningful.
type msg struct {
	kind     uint8
	op       uint8 // request: verbs.Opcode
	flags    uint8 // request: reqSolicited, reqNotify
	respKind uint8 // response
	rnrTimer uint8 // response to an RNR
	ok       bool  // region
	srcQPN   uint32
	dstQPN   uint32
	srcGID   [16]byte
	imm      uint32
	rkey     uint32
	length   uint32
	status   uint32 // response: verbs.WCStatus
	access   uint32 // region
	psn      uint32 // request
	addr     uint64 // request: remote address; region: its address
	size     uint64 // region: its length
	payload  []byte // request: SEND payload, aliasing the decoded buffer
}

var le = binary.LittleEndian

// encode appends m to b[:0] and returns the datagram.
func (m *msg) encode(b []byte) []byte {
	b = b[:0]
	switch m.kind {
	case msgHello:
		b = append(b, msgHello, wireVersion, 0, 0)
		b = le.AppendUint32(b, wireMagic)
		b = le.AppendUint32(b, m.srcQPN)
		b = le.AppendUint32(b, m.dstQPN)
		b = append(b, m.srcGID[:]...)
	case msgRequest:
		b = append(b, msgRequest, m.op, m.flags, 0)
		b = le.AppendUint32(b, m.imm)
		b = le.AppendUint32(b, m.rkey)
		b = le.AppendUint32(b, m.length)
		b = le.AppendUint64(b, m.addr)
		b = le.AppendUint32(b, m.psn)
		b = append(b, m.payload...)
	case msgMRQuery:
		b = append(b, msgMRQuery, 0, 0, 0)
		b = le.AppendUint32(b, m.rkey)
	case msgResponse:
		b = append(b, msgResponse, m.respKind, m.rnrTimer, 0)
		b = le.AppendUint32(b, m.status)
	case msgDoorbell:
		b = append(b, msgDoorbell)
	case msgRegion:
		ok := uint8(0)
		if m.ok {
			ok = 1
		}
		b = append(b, msgRegion, ok, 0, 0)
		b = le.AppendUint32(b, m.rkey)
		b = le.AppendUint32(b, m.access)
		b = le.AppendUint32(b, 0)
		b = le.AppendUint64(b, m.addr)
		b = le.AppendUint64(b, m.size)
	}
	return b
}

// decode parses datagram b into m. It allocates nothing; m.payload aliases b.
func (m *msg) decode(b []byte) error {
	*m = msg{}
	if len(b) == 0 {
		return fmt.Errorf("%w: empty", errMalformed)
	}
	m.kind = b[0]
	switch m.kind {
	case msgHello:
		if len(b) != helloLen || b[1] != wireVersion || le.Uint32(b[4:]) != wireMagic {
			return fmt.Errorf("%w: hello of %d bytes", errMalformed, len(b))
		}
		m.srcQPN, m.dstQPN = le.Uint32(b[8:]), le.Uint32(b[12:])
		copy(m.srcGID[:], b[16:32])
		if m.srcQPN > qpnMask || m.dstQPN > qpnMask {
			return fmt.Errorf("%w: QPN over 24 bits", errMalformed)
		}
	case msgRequest:
		if len(b) < requestLen || len(b) > maxMsg {
			return fmt.Errorf("%w: request of %d bytes", errMalformed, len(b))
		}
		m.op, m.flags = b[1], b[2]
		m.imm, m.rkey, m.length, m.addr = le.Uint32(b[4:]), le.Uint32(b[8:]), le.Uint32(b[12:]), le.Uint64(b[16:])
		if m.psn = le.Uint32(b[24:]); m.psn > qpnMask {
			return fmt.Errorf("%w: PSN over 24 bits", errMalformed)
		}
		m.payload = b[requestLen:len(b):len(b)]
		switch m.op {
		case opSend, opSendWithImm:
			if uint32(len(m.payload)) != m.length {
				return fmt.Errorf("%w: SEND of %d bytes carries %d", errMalformed, m.length, len(m.payload))
			}
		case opWrite, opWriteWithImm, opRead:
			if len(m.payload) != 0 {
				return fmt.Errorf("%w: RDMA request with payload", errMalformed)
			}
		default:
			return fmt.Errorf("%w: opcode %d", errMalformed, m.op)
		}
		if m.flags&^(reqSolicited|reqNotify) != 0 {
			return fmt.Errorf("%w: request flags %#x", errMalformed, m.flags)
		}
	case msgMRQuery:
		if len(b) != mrQueryLen {
			return fmt.Errorf("%w: region query of %d bytes", errMalformed, len(b))
		}
		m.rkey = le.Uint32(b[4:])
	case msgResponse:
		if len(b) != responseLen || b[1] < respAck || b[1] > respErr || b[2] > 31 {
			return fmt.Errorf("%w: response of %d bytes", errMalformed, len(b))
		}
		m.respKind, m.rnrTimer, m.status = b[1], b[2], le.Uint32(b[4:])
		if m.respKind == respErr && (m.status == 0 || m.status > maxWCStatus) {
			return fmt.Errorf("%w: error response with status %d", errMalformed, m.status)
		}
	case msgRegion:
		if len(b) != regionLen || b[1] > 1 {
			return fmt.Errorf("%w: region of %d bytes", errMalformed, len(b))
		}
		m.ok = b[1] == 1
		m.rkey, m.access, m.addr, m.size = le.Uint32(b[4:]), le.Uint32(b[8:]), le.Uint64(b[16:]), le.Uint64(b[24:])
		if m.ok && (m.size > maxRegionSize || m.addr+m.size < m.addr || m.access&^uint32(validAccess) != 0) {
			return fmt.Errorf("%w: region %#x+%d", errMalformed, m.addr, m.size)
		}
	case msgDoorbell:
		if len(b) != doorbellLen {
			return fmt.Errorf("%w: doorbell of %d bytes", errMalformed, len(b))
		}
	default:
		return fmt.Errorf("%w: kind %d", errMalformed, m.kind)
	}
	return nil
}
