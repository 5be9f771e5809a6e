package rsock

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// The proof is the first message each side sends over its new queue pair, after an
// accept and before the client's confirmation (upgrade.go). It does two things:
//
//   - It proves the path. A message that completes both ways on the new QPs shows that
//     RoCE packets cross between the two ports (UDP 4791 not filtered, routed to the
//     right device, the right GIDs); without it, a QP reaches RTS on a path that
//     carries nothing, and the first Write dies later.
//   - It binds the RDMA peer to the bootstrap peer. It echoes both hellos' nonces, which
//     travelled only on this bootstrap connection, so a proof that arrives over a QP
//     comes from the party that saw this connection's hellos. A hello replayed or
//     spliced onto another bootstrap connection carries nonces that connection never
//     sees proven.
//
// It also carries the sender's ring address and rkey, which the hellos leave out: a ring
// is revealed only over a proven QP, to the peer the QP is connected to.
//
// Wire format (big-endian), sent as one SEND that lands in the peer's proof WQE
// (rsock/internal/rdma, conn_proof.go; at most rdma.ProofMaxLen bytes):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------+---------------+---------------+---------------+
//	|     0x89      |      'R'      |      'P'      |     Role      |
//	+---------------+---------------+---------------+---------------+
//	|                                                               |
//	+          Client nonce (128): the offer's nonce                +
//	|                                                               |
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                                                               |
//	+          Server nonce (128): the accept's nonce               +
//	|                                                               |
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                     Ring RKey (32)                            |
//	+---------------------------------------------------------------+
//	|                                                               |
//	+                   Ring Address (64)                           +
//	|                                                               |
//	+---------------------------------------------------------------+
//
// Role is 'C' in the client's proof and 'S' in the server's, so that neither can be
// reflected back as the other. The proof belongs to hello version 2; a change to it
// takes a new hello version. The decoder rejects, with an error matching
// [ErrPathUnproven], any other length, magic or role; [proof.binds] checks the nonces.
//
// The nonces are not secret from the fabric: the proof travels in plaintext over RDMA,
// like the data after it. What it excludes is a party on the bootstrap connection alone
// (a proxy, a replay) getting an RDMA connection or a ring's key; see "Security" in the
// package docs.

const (
	proofLen    = 48
	roleClient  = 'C'
	roleServer  = 'S'
	proofMagic0 = 0x89
)

var proofMagic = [3]byte{proofMagic0, 'R', 'P'}

// The proof fits the peer's proof WQE.
var _ [rdma.ProofMaxLen - proofLen]struct{}

// proof is one decoded proof message.
type proof struct {
	role     byte
	client   nonce
	server   nonce
	ringRKey uint32
	ringAddr uint64
}

// appendTo appends the encoded proof to b.
func (p *proof) appendTo(b []byte) []byte {
	b = append(b, proofMagic[:]...)
	b = append(b, p.role)
	b = append(b, p.client[:]...)
	b = append(b, p.server[:]...)
	b = binary.BigEndian.AppendUint32(b, p.ringRKey)
	return binary.BigEndian.AppendUint64(b, p.ringAddr)
}

// decodeProof decodes a proof message, which must be exactly proofLen bytes.
func decodeProof(b []byte) (proof, error) {
	if len(b) != proofLen {
		return proof{}, fmt.Errorf("%w: proof of %d bytes, want %d", ErrPathUnproven, len(b), proofLen)
	}
	if !bytes.Equal(b[:3], proofMagic[:]) {
		return proof{}, fmt.Errorf("%w: proof starts with %x, not the proof magic", ErrPathUnproven, b[:3])
	}
	p := proof{role: b[3]}
	if p.role != roleClient && p.role != roleServer {
		return proof{}, fmt.Errorf("%w: proof role %#x", ErrPathUnproven, p.role)
	}
	copy(p.client[:], b[4:20])
	copy(p.server[:], b[20:36])
	p.ringRKey = binary.BigEndian.Uint32(b[36:40])
	p.ringAddr = binary.BigEndian.Uint64(b[40:48])
	return p, nil
}

// binds reports whether p is the proof the peer in role must send on the connection
// whose hellos carried the nonces client and server, or says why not.
func (p *proof) binds(role byte, client, server nonce) error {
	switch {
	case p.role != role:
		return fmt.Errorf("%w: a proof in role %q where %q's belongs", ErrPathUnproven, p.role, role)
	case p.client != client || p.server != server:
		return fmt.Errorf("%w: the proof's nonces are not this connection's: it belongs to another bootstrap connection", ErrPathUnproven)
	}
	return nil
}

// newNonce returns a fresh random nonce.
func newNonce() nonce {
	var n nonce
	rand.Read(n[:]) // never fails (crypto/rand)
	return n
}
