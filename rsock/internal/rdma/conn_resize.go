package rdma

import (
	"encoding/binary"
	"fmt"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// This file is the engine's side of flowctl's ring resize ("Resizing the ring" in
// flowctl's package docs; "Rings that grow" in this package's): registering a new ring
// and announcing it, reading the peer's announcement out of the mailbox, moving writes
// to the peer's new ring at our switch, and reads to our new ring at the peer's.

const (
	// mailboxSize bytes follow every ring in its memory region: the peer writes its
	// resize's payload at mailboxIn, and a ring's own description waits at mailboxOut
	// to be sent in the resize that announces it. flowctl allows one resize under way
	// per direction, so neither slot is ever needed twice at once. Before all that, the
	// first ring's proof WQE (conn_proof.go) takes the peer's proof in the mailbox, out
	// of the way of the data that follows it into the ring; no resize can come before
	// the proof has been read.
	mailboxSize  = 64
	mailboxIn    = 0
	mailboxOut   = 16
	mailboxProof = 0
	// legacyUnitRing is the largest ring of a 1-byte credit unit. A peer whose offer
	// names no unit ring (Offer.UnitRingSize) takes each ring's unit from its size,
	// and flowctl resizes only within one unit: toward it a ring grows to
	// legacyUnitRing at most, and one that starts above it does not grow.
	legacyUnitRing = 512 << 10
	// growFactor is how much a ring or a staging buffer grows at a time.
	growFactor = 4
	// growAfter is how many times a ring's worth of data passes through it before it
	// grows, if the peer never filled it.
	growAfter = 4
)

// ringAccess is how rings are registered: the peer writes them.
const ringAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite

// putRingDesc writes the payload of a resize: where the new ring is (address and key)
// and its size, which the resize's immediate names too.
func putRingDesc(b []byte, addr uint64, rkey, size uint32) {
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], rkey)
	binary.LittleEndian.PutUint32(b[12:], size)
}

// parseRingDesc reads what putRingDesc wrote.
func parseRingDesc(b []byte) (addr uint64, rkey, size uint32) {
	return binary.LittleEndian.Uint64(b[0:]), binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:])
}

// maybeGrowLocked grows the ring after a data arrival of n bytes when the peer holds
// three quarters of it or more (buffered, or consumed and not yet credited), or when
// the ring has turned over growAfter times since it became current: either way the
// stream is busy, and a larger ring lets more of it be in flight. Past 512 KiB only the
// first counts: the writer sweeps the whole ring, so a ring costs its size in cache
// however little of it is in flight, and only a writer that is about to wait for the
// reader gains from a larger one. (Growing to 4 MiB by turnover too made eight
// concurrent net/http streams of 1 MiB bodies on soft 25% slower.) Called with mu
// held.
func (c *Conn) maybeGrowLocked(n int) {
	c.turnover += uint64(n)
	ring := c.fc.RingSize()
	if c.growTo <= ring || c.fc.Resizing() || c.fc.OldRing() || c.fc.PeerClosed() || c.closing || c.err != nil {
		return
	}
	full := 4*c.fc.Held() >= 3*ring
	if !full && c.turnover < growAfter*uint64(ring) {
		return
	}
	next := min(ring*growFactor, c.growTo)
	if next > legacyUnitRing {
		if !full {
			return
		}
		if !c.ep.growthFits(next + mailboxSize) {
			c.growTo = ring // and no further, for this connection; idle, it still shrinks
			return
		}
	}
	c.resizeLocked(next)
}

// idleShrinkLocked shrinks a grown ring back to its first size when no data arrived
// since the last keepalive tick and nothing is buffered. Called with mu held, from each
// keepalive period's sendKeepalive.
func (c *Conn) idleShrinkLocked() {
	arrived := c.dataArrivals
	idle := arrived == c.arrivalsAtTick
	c.arrivalsAtTick = arrived
	if !idle || c.growTo == 0 {
		return
	}
	first := c.ep.opts.RingSize
	if c.fc.RingSize() <= first || c.fc.Buffered() != 0 ||
		c.fc.Resizing() || c.fc.OldRing() || c.fc.PeerClosed() || c.closing || c.err != nil {
		return
	}
	c.resizeLocked(first)
	c.postControlLocked()
}

// resizeLocked registers a ring of size bytes (and its mailbox), writes its description
// where the resize will carry it from, and asks flowctl to announce it; the caller posts
// control messages next. A ring that cannot be registered (the budget, RLIMIT_MEMLOCK)
// stops growth for good, and the connection goes on with the ring it has; idle, that
// ring still shrinks, and grows back to it at most. A smaller ring that cannot be
// registered stops resizing altogether.
func (c *Conn) resizeLocked(size int) {
	mr, err := c.ep.registerMR(size+mailboxSize, ringAccess, "receive ring")
	if err == nil {
		if err = c.fc.Resize(size); err != nil {
			mr.Close()
		}
	}
	if err != nil {
		c.growErr = err
		if ring := c.fc.RingSize(); size > ring {
			c.growTo = ring
		} else {
			c.growTo = 0
		}
		return
	}
	putRingDesc(mr.Bytes()[size+mailboxOut:], mr.Addr(), mr.RKey(), uint32(size))
	c.ep.nextRing, c.nextRingSize = mr, size
	c.turnover = 0
}

// fillResizeWR prepares c.wrs[0] to carry the resize m: the new ring's description,
// from behind that ring, into the mailbox behind the peer's ring.
func (c *Conn) fillResizeWR(m flowctl.Msg) {
	mr := c.ep.nextRing
	c.fillMailboxWR(m, mailboxIn, mr.Addr()+uint64(c.nextRingSize)+mailboxOut, mr.LKey())
}

// fillMailboxWR prepares c.wrs[0] to carry m's payload, registered at addr with lkey,
// into the peer's mailbox at offset slot: the mailbox behind the ring the peer's data
// lands in now.
func (c *Conn) fillMailboxWR(m flowctl.Msg, slot, addr uint64, lkey uint32) {
	wr := &c.wrs[0]
	wr.Opcode = verbs.OpRDMAWriteWithImm
	wr.Imm = m.Imm
	wr.RemoteAddr = c.peerRingAddr + uint64(c.fc.PeerRingSize()) + slot
	wr.RKey = c.peerRKey
	wr.Flags = 0
	c.sges[0][0] = verbs.SGE{Addr: addr, Length: uint32(m.Len), LKey: lkey}
	wr.SGL = c.sges[0][:]
	if m.Len <= c.inline {
		wr.Flags |= verbs.SendInline
	}
}

// onResizeLocked reads the peer's new ring out of our mailbox when its resize arrives,
// before anything else can arrive there; our writes move to it at our switch.
func (c *Conn) onResizeLocked(byteLen, imm uint32) error {
	m, err := flowctl.DecodeImm(imm, byteLen) // OnArrival accepted it
	if err != nil {
		return err
	}
	ring := c.fc.RingSize()
	addr, rkey, size := parseRingDesc(c.ep.ring.Bytes()[ring+mailboxIn:])
	if size != 1<<m.RingLog2 {
		return fmt.Errorf("%w: resize to %d bytes describes a ring of %d", ErrProtocol, 1<<m.RingLog2, size)
	}
	c.peerNextAddr, c.peerNextRKey = addr, rkey
	return nil
}

// onSwitchLocked makes the announced ring ours once the peer's switch arrives: data
// lands there from now on. The old ring stays while it holds bytes (Unread names them
// there); freeOldRingLocked lets it go.
func (c *Conn) onSwitchLocked() {
	old, oldSize := c.ep.ring, len(c.ring)
	c.ep.ring, c.ep.nextRing = c.ep.nextRing, nil
	c.ring = c.ep.ring.Bytes()[:c.fc.RingSize()]
	c.ringSwitches++
	if c.fc.OldRing() {
		c.ep.oldRing, c.oldRing = old, old.Bytes()[:oldSize]
		return
	}
	// Nothing unread in it, so no Read is copying from it.
	if err := old.Close(); err != nil {
		c.failLocked(fmt.Errorf("%w: free the old ring: %w", ErrQPFailed, err))
	}
}

// freeOldRingLocked frees the old ring once its last byte is consumed.
func (c *Conn) freeOldRingLocked() {
	if c.oldRing == nil || c.fc.OldRing() {
		return
	}
	err := c.ep.oldRing.Close()
	c.ep.oldRing, c.oldRing = nil, nil
	if err != nil {
		c.failLocked(fmt.Errorf("%w: free the old ring: %w", ErrQPFailed, err))
	}
}

// readRingLocked is the memory Unread's pieces are in: the old ring while it holds
// bytes, else the current one.
func (c *Conn) readRingLocked() []byte {
	if c.fc.OldRing() {
		return c.oldRing
	}
	return c.ring
}

// growStageLocked replaces the staging buffer by one four times larger (up to
// SendBufferSize) when staging, not credit, limits a write. Sends still in flight from
// the old buffer keep it until they complete (freeOldStageLocked); the new one starts
// empty, at the cursor where the old one ended, so the cursors stay monotonic. A buffer
// that cannot be registered stops growth; writes go on with the old one. Called with mu
// held, by a writer (wmu held: nobody reads into staging outside mu meanwhile).
func (c *Conn) growStageLocked() {
	size := min(len(c.stage)*growFactor, c.stageMax)
	if size > maxGrownSendBuffer && !c.ep.growthFits(size) {
		// Past 256 KiB (a provider that pins: stageMax) staging grows, as rings past
		// 512 KiB do, only while the process pins at most half of RLIMIT_MEMLOCK.
		c.stageMax = len(c.stage)
		return
	}
	mr, err := c.ep.registerMR(size, verbs.AccessLocalWrite, "send buffer")
	if err != nil {
		c.stageMax, c.growErr = len(c.stage), err
		return
	}
	c.ep.oldSend, c.ep.sendBuf = c.ep.sendBuf, mr
	c.stage, c.stageKey, c.stageAddr = mr.Bytes(), mr.LKey(), mr.Addr()
	c.stageHead = c.stageTail
	c.oldStageUntil = c.sqPosted
	c.maxChunk = max(size/4, 1)
	c.freeOldStageLocked()
}

// stageMax is the largest staging buffer the endpoint's Conn grows to: SendBufferSize,
// or, where withDefaults chose it and the provider pins memory, pinnedSendBuffer.
func (ep *Endpoint) stageMax() int {
	if ep.opts.pinnedSendBuffer > ep.opts.SendBufferSize && ep.dev != nil && ep.pinsMemory() {
		return ep.opts.pinnedSendBuffer
	}
	return ep.opts.SendBufferSize
}

// idleShrinkStageLocked replaces a grown staging buffer with one of its first size
// when nothing was staged since the last keepalive tick and nothing staged is in
// flight: staging is registered (pinned, on a device) and grows to SendBufferSize for
// a busy stream, and an idle connection need not keep it. A Write after that grows it
// again as it needs. A buffer that cannot be registered leaves the larger one in place
// until a later tick. Called with mu held, from each keepalive period's sendKeepalive.
func (c *Conn) idleShrinkStageLocked() {
	staged := c.stageTail
	idle := staged == c.stagedAtTick
	c.stagedAtTick = staged
	if !idle || c.ep == nil { // nil: a test's fake Conn
		return
	}
	first := c.ep.opts.firstSendBuffer()
	if len(c.stage) <= first || c.stageHead != c.stageTail || c.stageLent ||
		c.ep.oldSend != nil || c.closing || c.err != nil {
		return
	}
	mr, err := c.ep.registerMR(first, verbs.AccessLocalWrite, "send buffer")
	if err != nil {
		return
	}
	old := c.ep.sendBuf
	c.ep.sendBuf = mr
	c.stage, c.stageKey, c.stageAddr = mr.Bytes(), mr.LKey(), mr.Addr()
	c.maxChunk = max(first/4, 1)
	if err := old.Close(); err != nil {
		c.failLocked(fmt.Errorf("%w: free the grown send buffer: %w", ErrQPFailed, err))
	}
}

// freeOldStageLocked frees the replaced staging buffer once no send from it is in
// flight.
func (c *Conn) freeOldStageLocked() {
	if c.ep == nil || c.ep.oldSend == nil || c.sqDone < c.oldStageUntil {
		return
	}
	err := c.ep.oldSend.Close()
	c.ep.oldSend = nil
	if err != nil {
		c.failLocked(fmt.Errorf("%w: free the old send buffer: %w", ErrQPFailed, err))
	}
}

// The proof WQE's buffer lies within the mailbox.
var _ [mailboxSize - mailboxProof - ProofMaxLen]struct{}
