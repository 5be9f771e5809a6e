package rdma

import (
	"errors"
	"fmt"

	"github.com/rsockio/rsock/verbs"
)

// This file is the proof exchange: the first message each side sends on a new QP, before
// any flow-controlled traffic, so that the caller can prove the path (and bind the QP to
// its bootstrap connection) before it declares the upgrade.
//
// Prepare posts one receive WQE before the flow-controlled ones, the proof WQE (WR ID
// index proofRecvIndex), whose buffer is ProofMaxLen bytes of the first ring's mailbox
// (mailboxProof), never written again, so that no data races the proof's reading. RC
// delivers in order and a receive queue is consumed in order, so the peer's first
// message lands in it, whatever it is. That message must be a SEND of at most
// ProofMaxLen bytes (its payload is the caller's business: rsock puts its proof in
// it); anything else fails the Conn with ErrProtocol. The proof WQE is not re-posted.
//
// The proof stays outside flow control, and flowctl's invariants hold unchanged:
//
//   - The proof WQE is posted in addition to Options.RecvWQEs, which alone are the
//     peer's initial WQE credit; the peer's proof spends exactly the proof WQE.
//   - The proof's bytes land in the mailbox, not the ring, so no ring credit is spent
//     on it and none is returned for it.
//   - Our own proof is one signaled SEND, numbered and retired like any send WR, whose
//     staging bytes free with its completion.

// ProofMaxLen is the largest proof payload: the size of the proof WQE's buffer.
const ProofMaxLen = 64

// proofRecvIndex is the receive WQE index of the proof WQE, in its WR ID with
// recvWRFlag and the endpoint's generation like every receive WQE: an index no
// flow-controlled WQE uses.
const proofRecvIndex = seqMask

// ErrNoProof reports that the Conn failed, or was closed, before the peer's proof
// arrived.
var ErrNoProof = errors.New("rdma: no proof from the peer")

// proofState is a Conn's side of the exchange. Guarded by Conn.mu. got is set, and
// done closed, once, when the peer's proof arrived or the Conn failed first; done is
// made by the first ProofDone, which most connections never call (SpinProof and
// OnProof wait without it), so that setting up one allocates no channel for nothing.
type proofState struct {
	done chan struct{} // nil until ProofDone
	got  bool          // the wait is over; done, if made, is closed
	buf  [ProofMaxLen]byte
	n    int
	err  error
	// arrived, if set (OnProof), is told once the proof has arrived.
	arrived ProofHandler
	// watched: ProofDone or OnProof waits on the poller's dispatch, counted as a
	// parked waiter (Conn.parking) until the wait is over.
	watched bool
}

// watchProofLocked counts a wait for the proof through ProofDone or OnProof as a
// parked waiter of the poller, once: from now on only the poller's dispatch ends it.
// Called with mu held.
func (c *Conn) watchProofLocked() {
	if !c.proof.got && !c.proof.watched {
		c.proof.watched = true
		c.parking()
	}
}

// finishProofLocked records the outcome of the wait for the peer's proof, once. Called
// with mu held.
func (c *Conn) finishProofLocked(n int, err error) {
	if c.proof.got {
		return
	}
	c.proof.got, c.proof.n, c.proof.err = true, n, err
	// The handler is told at most once, by the caller that ends the wait with the
	// proof (onProof, which took it first); dropped now, it keeps nothing of the
	// handshake (the server's accept state) alive for the Conn's life.
	c.proof.arrived = nil
	if c.proof.done != nil {
		close(c.proof.done)
	}
	if c.proof.watched {
		c.unparked()
	}
}

// onProof handles the completion of the proof WQE, on the poller's goroutine.
func (c *Conn) onProof(wc *verbs.WorkCompletion) {
	cause := c.transportCause(wc) // before mu, as in onCompletion
	c.mu.Lock()
	var err error
	switch {
	case wc.Status != verbs.WCSuccess:
		err = completionError("proof", wc, cause)
	case wc.Opcode != verbs.WCRecv || wc.Flags&verbs.WCWithImm != 0:
		err = fmt.Errorf("%w: the peer's first message is a %v completion, not a proof", ErrProtocol, wc.Opcode)
	case wc.ByteLen > ProofMaxLen:
		// Unreachable on a device that honours the WQE's length; checked all the same.
		err = fmt.Errorf("%w: proof of %d bytes", ErrProtocol, wc.ByteLen)
	}
	if err != nil {
		c.failLocked(err)
		c.mu.Unlock()
		return
	}
	first := !c.proof.got // else the Conn failed first: ProofDone says so
	n := copy(c.proof.buf[:], c.proofSlot[:wc.ByteLen])
	arrived := c.proof.arrived
	c.finishProofLocked(n, nil)
	c.mu.Unlock()
	if first && arrived != nil {
		arrived.ProofArrived()
	}
}

// OnProof has h told once the peer's proof has arrived, on the goroutine that
// received it (the poller's), after the Conn has recorded it and with no lock held, so
// that the caller can answer the proof without a goroutine of its own woken to do it.
// It is set before the peer can send its proof, and h is not told when the Conn
// failed first ([Conn.ProofDone] and [Conn.Proof] say so either way). h must not
// block, nor close or abandon the Conn (the poller is not to wait for itself): it may
// call Proof, SetPeerRing and SendProof.
func (c *Conn) OnProof(h ProofHandler) {
	c.mu.Lock()
	c.proof.arrived = h
	c.watchProofLocked()
	c.mu.Unlock()
}

// ProofHandler is told of the peer's proof ([Conn.OnProof]). It is an interface rather
// than a function so that a caller's state that answers the proof can be handed over
// as it is, a pointer, where a closure over it would cost every connection an
// allocation.
type ProofHandler interface {
	ProofArrived()
}

// ProofFunc is a function as a [ProofHandler].
type ProofFunc func()

// ProofArrived calls f.
func (f ProofFunc) ProofArrived() { f() }

// SendProof posts p (at most ProofMaxLen bytes) to the peer as one signaled SEND, the
// first message on the QP. It is called at most once, before [Conn.Start]; the peer's
// proof WQE takes it.
func (c *Conn) SendProof(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case len(p) == 0 || len(p) > ProofMaxLen:
		return fmt.Errorf("rdma: proof of %d bytes, want 1 to %d", len(p), ProofMaxLen)
	case c.sqPosted != 0:
		return errors.New("rdma: proof after other sends")
	case c.err != nil:
		return c.err
	case len(p) > c.stageContig():
		return fmt.Errorf("rdma: proof of %d bytes exceeds the %d-byte send buffer", len(p), len(c.stage))
	}
	off := c.stageTail % uint64(len(c.stage))
	copy(c.stage[off:], p)
	wr := &c.wrs[0]
	*wr = verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendSignaled}
	c.sges[0][0] = verbs.SGE{Addr: c.stageAddr + off, Length: uint32(len(p)), LKey: c.stageKey}
	wr.SGL = c.sges[0][:]
	c.stageTail += uint64(len(p))
	c.wrEnd[0] = c.stageTail
	return c.postLocked(1)
}

// ProofDone returns a channel closed when the peer's proof has arrived or the Conn has
// failed before it; [Conn.Proof] then says which.
func (c *Conn) ProofDone() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proof.done == nil {
		c.proof.done = make(chan struct{})
		if c.proof.got {
			close(c.proof.done)
		}
	}
	c.watchProofLocked()
	return c.proof.done
}

// proofOver reports whether the wait for the peer's proof is over, as a closed
// ProofDone would, without making its channel.
func (c *Conn) proofOver() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proof.got
}

// SpinProof polls the Conn's completion queue for the peer's proof, as a waiting Read
// polls for its data (conn_poll.go): up to the poller's spin bound, yielding between
// empty polls, then it gives up. It reports whether ProofDone is closed by then. A
// caller that waits for the proof calls it first and blocks on ProofDone only when it
// returns false: a proof that comes back within the spin is taken by the waiting
// goroutine itself, without a hand-off from the poller's goroutine (which may have to
// be woken for it first), and the caller needs no timer for that wait. Whatever else
// it reaps it dispatches to its owners, as the poller would.
func (c *Conn) SpinProof() bool {
	s := spin{c: c}
	defer s.end()
	for {
		if c.proofOver() {
			return true
		}
		if !s.more() {
			return false
		}
		c.pollWaiting(s.polls)
	}
}

// Proof returns the peer's proof payload once ProofDone is closed; before, or when the
// Conn failed first, an error (matching ErrNoProof, and the failure). The payload is
// the Conn's own record, never written again once ProofDone is closed: the caller reads
// it and must not modify it (returning it rather than a copy spares setup an
// allocation).
func (c *Conn) Proof() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.proof.got:
		return nil, fmt.Errorf("%w yet", ErrNoProof)
	case c.proof.err != nil:
		return nil, fmt.Errorf("%w: %w", ErrNoProof, c.proof.err)
	}
	return c.proof.buf[:c.proof.n:c.proof.n], nil
}

// SetPeerRing sets the peer's ring address and key, which the caller learned from the
// peer's proof rather than from the Offer. It is called before [Conn.Start], before any
// Write.
func (c *Conn) SetPeerRing(addr uint64, rkey uint32) {
	c.mu.Lock()
	c.peerRingAddr, c.peerRKey = addr, rkey
	c.mu.Unlock()
}

// QueryQP reports the attributes the Conn's QP runs with, as the device applied them
// (traffic class and service level included), where the provider can say
// ([verbs.QPQuerier]).
func (c *Conn) QueryQP() (verbs.QPAttr, error) {
	q, ok := c.qp.(verbs.QPQuerier)
	if !ok {
		return verbs.QPAttr{}, fmt.Errorf("rdma: query QP: the provider's QPs do not report their attributes")
	}
	return q.Query()
}
