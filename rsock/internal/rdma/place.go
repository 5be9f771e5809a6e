package rdma

import (
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// Direct placement: a large Read's buffer written by the peer's device.
//
// A Read copies its bytes out of the ring, and for a large transfer that copy is half
// the work left once Writes post from the application's buffer (zcopy.go). So a Read of
// at least placeMinRead bytes that finds nothing buffered advertises its buffer instead
// (flowctl's "Direct placement"): it registers the buffer for the peer to write, sends
// its address, key and the stream cursor it continues to the peer's mailbox, and waits
// as usual. A Write that finds the advertisement usable (its cursor is the Write's, so
// nothing it wrote is still on its way to the ring) writes its next bytes into that
// buffer in one RDMA_WRITE_WITH_IMM, from the application's buffer when the Write is
// direct, else from staging; the Read returns them with no copy. A Write that finds
// it unusable, or a ReadFrom, writes to the ring as before, and the advertisement is
// declined; ring data that arrives meanwhile is read as usual, the buffer being the
// Read's again at once, since the peer no longer places once it wrote past the cursor.
//
// Only endpoints whose provider does not pin take part (soft, whose peers are
// goroutines of this process): there an advertised buffer's registration is kept in a
// small cache, as a direct write's is, and let go at the keepalive tick after its last
// use and at Close. On one that pins (rdma-core), a cache would leave the
// application's buffers writable by the peer after Read returns, and registering each
// Read's buffer for that Read alone (deregistered before it returns), which this file
// did at first, gained nothing: on Soft-RoCE in the CI's VM, 1 MiB streams ran at
// 0.99-1.05x of the same build without placement in one boot's three rounds, and
// slower in another's (36.5-36.9 against 38.1-42.9 MB/s), while each such Read pinned
// and unpinned its buffer and allocated the region's records. Memory windows, bound to
// a cached region for one Read and invalidated by the peer's last write, are the way
// to take that copy on hardware.
//
// A Read that must return while its advertisement is still usable (its deadline
// passed, Close, a failure) first withdraws it: it sends a cancel and waits for the
// answer, the bytes placed (which it then returns) or a decline, or for the QP to leave
// service (a failure, teardown), after which nothing lands. So a deadline may be
// overrun by one round trip to the peer's engine, and no byte is lost; a peer that
// does not answer within placeCancelTimeout fails the connection.
//
// Both sides must say they can (the hello's capPlace; an endpoint can when its PD
// registers the application's memory without pinning it, and Options.NoPlacement is
// not set). An advertisement costs two small messages, so a Read advertises only from
// placeMinRead bytes, and after its advertisements are declined it lets more and more
// eligible Reads pass without one (placement.skip).
//
// Placement also makes the two ends take turns: the Write waits for the Read's
// advertisement and the Read for the Write's placement, where through the ring the
// writer's copy of the next bytes overlaps the reader's copy of the last. The copy it
// saves must outweigh those two hand-offs per Read. On soft it does from 128 KiB Reads
// on, not at 64 KiB (BenchmarkStreamRead, four runs, 2026-11-30: 64 KiB Reads placed
// into ran at 10.6-13.6 GB/s, through the ring at 13.0-23.1; 128 KiB ones at 14.7-25.9
// and 16.6-26.7; 1 MiB ones at 21.2-39.7 and 9.1-11.8. rsockperf's 64 KiB stream,
// twelve alternated rounds: 0.50x SoftVerbs placed against 0.57x through the ring,
// medians).
const (
	placeMinRead   = 128 << 10
	placeCacheSize = 2
	// placeCancelTimeout bounds the wait for the answer to a cancel, which a live peer
	// sends within a round trip: a peer that does not answer fails the connection.
	placeCancelTimeout = 5 * time.Second
	placeSkipMax       = 63 // most eligible Reads skipped after declines
	placeSkipDoublings = 7  // declines in a row after which skip stops growing: 0, 1, 3 … 63
	// A large Write's wait for the next advertisement gives up on it (awaitAdvert)
	// only after this many spins in a row ended without one.
	placeMissesMax = 2
	// A wait on a placement of n bytes spins n/placeSpinUnit times the poller's spin
	// (placeSpinScale), at least once and at most placeSpinScaleMax times.
	placeSpinUnit     = 128 << 10
	placeSpinScaleMax = 16
	mailboxPlace      = 32 // where the peer's advertisement lands in the mailbox
)

// placement is a Conn's state of direct placement. Guarded by mu, but for reg; mr is
// set and cleared by the Read holding rmu (and, for a cached region, by teardown).
type placement struct {
	// reg is the endpoint's PD when both sides place, else nil. Connect sets it and
	// nothing changes it after, so Read and Write look at it without mu.
	reg         verbs.MemoryRegistrar
	out         verbs.MR // registered AdvertLen bytes the advertisements are sent from; made by the first
	off         bool     // advertising failed for want of resources: this side no longer advertises
	mr          verbs.MR // the advertised buffer's region, while the Read that advertised it runs
	mrOff       uint64   // the buffer's offset in it
	cache       [placeCacheSize]directMR
	clock       uint64      // use counter, for least-recently-used replacement
	atTick      uint64      // clock at the last keepalive tick
	placed      int         // bytes the peer placed into it, once the answer arrived
	skip        int         // eligible Reads to let pass before the next advertisement
	declines    int         // advertisements declined in a row
	cancelTimer *time.Timer // bounds the wait for a cancel's answer (readPlaced)
	expect      bool        // the peer's last advertisement was placed into, or came too late: awaitAdvert
	misses      int         // awaitAdvert's spins in a row that ended without an advertisement
	peerAddr    uint64      // the peer's usable advertisement: its buffer's address and key
	peerRKey    uint32      //
}

// Placing reports whether the connection takes part in direct placement: both sides
// said they could, and this side did not turn it off (Options.NoPlacement).
func (c *Conn) Placing() bool { return c.place.reg != nil }

// canAdvertiseLocked reports whether a Read of n bytes that found nothing buffered
// advertises its buffer now.
func (c *Conn) canAdvertiseLocked(n int) bool {
	pl := &c.place
	if pl.reg == nil || pl.off || n < placeMinRead || c.fc.AdvertPending() || c.fc.PeerClosed() ||
		c.err != nil || c.closing || c.spill.len() > 0 || c.fc.Buffered() > 0 {
		return false
	}
	if pl.skip > 0 {
		pl.skip--
		return false
	}
	return true
}

// advertiseLocked registers p for the peer to write and asks flowctl to advertise it;
// postControlLocked sends the advertisement. It reports whether it advertised; a
// registration that fails turns advertising off for the Conn. Called with mu held, by
// a Read that found nothing buffered.
func (c *Conn) advertiseLocked(p []byte) bool {
	pl := &c.place
	if pl.out == nil {
		out, err := c.ep.registerMR(flowctl.AdvertLen, verbs.AccessLocalWrite, "advertisement")
		if err != nil {
			pl.off = true
			return false
		}
		pl.out = out
	}
	p = p[:min(len(p), flowctl.MaxPlaceLen)]
	mr, off := c.placeRegionLocked(p)
	if mr == nil {
		return false
	}
	if _, err := c.fc.Advertise(len(p)); err != nil {
		return false // cannot happen: the Read found nothing buffered
	}
	pl.mr, pl.mrOff, pl.placed = mr, off, 0
	c.postControlLocked()
	return true
}

// placeRegionLocked returns p's region for the peer to write, and the offset of p in
// it, from the cache, registering p there in place of the least recently used buffer.
// It returns nil, and turns advertising off, when a registration fails.
func (c *Conn) placeRegionLocked(p []byte) (verbs.MR, uint64) {
	const access = verbs.AccessLocalWrite | verbs.AccessRemoteWrite
	pl := &c.place
	pl.clock++
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	victim := 0
	for i := range pl.cache {
		e := &pl.cache[i]
		if e.mr == nil {
			victim = i
			continue
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(e.buf)))
		if start >= base && start+uintptr(len(p)) <= base+uintptr(len(e.buf)) {
			e.used = pl.clock
			return e.mr, uint64(start - base)
		}
		if v := &pl.cache[victim]; v.mr != nil && e.used < v.used {
			victim = i
		}
	}
	e := &pl.cache[victim]
	if e.mr != nil {
		c.dropPlaceMR(e.mr) // no advertisement is under way: this Read makes the next
		*e = directMR{}
	}
	mr, err := pl.reg.RegMemory(p, access)
	if err != nil {
		pl.off = true
		return nil, 0
	}
	*e = directMR{mr: mr, buf: p, used: pl.clock}
	return mr, 0
}

// idlePlaceLocked deregisters, and stops referencing, the cached buffers no Read
// advertised since the last keepalive tick. Called with mu held, from the keepalive
// timer.
func (c *Conn) idlePlaceLocked() {
	pl := &c.place
	if c.fc.AdvertPending() || pl.mr != nil {
		return // the Read in progress may be using any entry
	}
	for i := range pl.cache {
		if e := &pl.cache[i]; e.mr != nil && e.used <= pl.atTick {
			c.dropPlaceMR(e.mr)
			*e = directMR{}
		}
	}
	pl.atTick = pl.clock
}

// dropPlaceMR deregisters an advertised buffer; a deregistration that fails fails the
// Conn (its QP goes to ERROR: nothing more lands).
func (c *Conn) dropPlaceMR(mr verbs.MR) {
	if err := mr.Close(); err != nil {
		c.taintPD()
		c.failLocked(fmt.Errorf("%w: deregister a read buffer: %w", ErrQPFailed, err))
	}
}

// fillAdvertWR prepares c.wrs[0] to carry the advertisement m: the buffer's address,
// key and the low half of its cursor, from the advertisement buffer into the mailbox
// behind the peer's ring.
func (c *Conn) fillAdvertWR(m flowctl.Msg) {
	pl := &c.place
	_, at := c.fc.Advert()
	putRingDesc(pl.out.Bytes(), pl.mr.Addr()+pl.mrOff, pl.mr.RKey(), uint32(at))
	c.fillMailboxWR(m, mailboxPlace, pl.out.Addr(), pl.out.LKey())
}

// onPlaceLocked handles an accepted placement message. An advertisement is read out
// of the mailbox at once, before another can land there; flowctl decides whether it
// is usable.
func (c *Conn) onPlaceLocked(a flowctl.Arrival) error {
	pl := &c.place
	switch a.Op {
	case flowctl.PlaceAdvert:
		addr, rkey, lo := parseRingDesc(c.ep.ring.Bytes()[c.fc.RingSize()+mailboxPlace:])
		if err := c.fc.PeerAdvert(lo); err != nil {
			return err
		}
		pl.peerAddr, pl.peerRKey = addr, rkey
		// One that came after this side wrote on says the peer's Reads wait:
		// the next large Write waits for its next advertisement (awaitAdvert).
		pl.expect = true
	case flowctl.PlacePlaced:
		pl.placed = a.Len
		pl.declines, pl.skip = 0, 0
		c.stats.placedInto(a.Len)
	case flowctl.PlaceDecline:
		pl.declines = min(pl.declines+1, placeSkipDoublings)
		pl.skip = min(1<<(pl.declines-1)-1, placeSkipMax)
	}
	return nil
}

// placeRoomLocked is how many bytes a Write may place now into the peer's
// advertisement, with a send-queue slot free: zero when none is usable.
func (c *Conn) placeRoomLocked() int {
	if c.place.reg == nil || c.sqPosted-c.sqDone >= c.sqDepth {
		return 0
	}
	return c.fc.Placeable()
}

// awaitAdvert is a large Write's wait for the peer's advertisement, when one is
// expected and not here yet. A reader that advertises does so after its last Read
// returned, which is after this side's last write reached it; so the next Write
// usually starts before the advertisement arrives, and writing to the ring then would
// decline it and copy every byte once more. So a Write of at least placeMinRead bytes,
// while the peer's last advertisement was placed into or came after this side wrote
// on (expect), first spins for the next one, as a waiting Read spins (conn_poll.go),
// longer for a larger Write (placeSpinScale). Only placeMissesMax spins in a row that
// end without one stop the waiting, until an advertisement comes again: one late
// advertisement (the reader was descheduled) would otherwise send every later Write
// to the ring, where the reader always finds bytes buffered and never advertises
// again. n is the Write's length. Called with wmu held.
func (c *Conn) awaitAdvert(n int) {
	s := spin{c: c, scale: placeSpinScale(n)}
	defer s.end()
	for {
		c.mu.Lock()
		pl := &c.place
		if !pl.expect || c.fc.Placeable() > 0 || c.err != nil || c.closing || c.writeClosed {
			c.mu.Unlock()
			return
		}
		if !s.more() {
			pl.misses++
			pl.expect = pl.misses < placeMissesMax
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.pollWaiting(s.polls)
	}
}

// placeSpinScale is how many times the poller's spin a wait on a placement of n bytes
// spins: a Read that advertised n bytes waits for the peer to copy them, and the
// writer of n bytes for a reader that took its last n. On soft, a 1 MiB stream's reader
// that spun the usual spin parked on 17–53% of its Reads (four runs); each park cost a
// wake-up, and some a late advertisement that sent the writer to the ring.
func placeSpinScale(n int) int {
	return min(max(n/placeSpinUnit, 1), placeSpinScaleMax)
}

// postPlaceLocked places n bytes (n ≤ placeRoomLocked()), registered at addr with lkey,
// into the peer's advertised buffer, in one signaled RDMA_WRITE_WITH_IMM. Its staging,
// if any, ends at stageTail.
func (c *Conn) postPlaceLocked(addr uint64, lkey uint32, n int) error {
	m, err := c.fc.ReservePlace(n)
	if err != nil {
		c.failLocked(protocolError(err))
		return c.err
	}
	wr := &c.wrs[0]
	wr.Opcode = verbs.OpRDMAWriteWithImm
	wr.Imm = m.Imm
	wr.RemoteAddr = c.place.peerAddr
	wr.RKey = c.place.peerRKey
	wr.Flags = verbs.SendSignaled
	c.sges[0][0] = verbs.SGE{Addr: addr, Length: uint32(n), LKey: lkey}
	wr.SGL = c.sges[0][:]
	if n <= c.inline {
		wr.Flags |= verbs.SendInline
	}
	c.wrEnd[0] = c.stageTail
	if err := c.postLocked(1); err != nil {
		return err
	}
	c.place.misses = 0
	c.stats.sent(1, n)
	return nil
}

// placeStagedLocked copies up to len(p) bytes into staging and places them; it returns
// how many, zero when staging has no room now. Called with mu held, by a Write.
func (c *Conn) placeStagedLocked(p []byte, room int) (int, error) {
	contig := c.stageContig()
	if contig < min(len(p), room) && len(c.stage) < c.stageMax && c.ep != nil && c.ep.oldSend == nil {
		c.growStageLocked() // as writeRoomLocked does
		contig = c.stageContig()
	}
	n := min(len(p), room, contig)
	if n == 0 {
		return 0, nil
	}
	copy(c.stageWindow(n), p)
	addr := c.stageAddr + c.stageTail%uint64(len(c.stage))
	c.stageTail += uint64(n)
	if err := c.postPlaceLocked(addr, c.stageKey, n); err != nil {
		return 0, err
	}
	return n, nil
}

// readPlacing is Read for a buffer large enough to advertise, on a Conn that may: the
// first look that finds nothing buffered advertises p, and the Read returns the bytes
// placed into it, if they come first, else ring bytes as usual. Called with rmu held.
func (c *Conn) readPlacing(p []byte) (int, error) {
	s := spin{c: c, answer: c.awaitsAnswer()}
	defer s.end()
	advertise := p      // the first look that finds nothing may advertise p
	advertised := false // it did
	for {
		if c.rdl.passed() {
			return c.endRead(&s, advertised, os.ErrDeadlineExceeded)
		}
		park := s.parking()
		if !park && s.quiet() && s.more() {
			c.pollWaiting(s.polls)
			continue
		}
		seen := c.readChanges.Load()
		var v unreadView
		err := c.unread(&v, park, advertise, advertised)
		advertise = nil
		if v.advertised {
			advertised = true
			s.scale = placeSpinScale(len(p)) // it waits for the peer to copy p's worth
		}
		if err != nil || v.placed > 0 {
			return c.endRead(&s, advertised, err)
		}
		if v.empty() {
			s.foundNothing(seen)
			if s.more() {
				c.pollWaiting(s.polls)
				continue
			}
			if !park {
				continue // look once more, marked parked
			}
			if err := c.waitReadable(); err != nil {
				return c.endRead(&s, advertised, err)
			}
			continue
		}
		// Data arrived since an advertisement of p, if any: the peer no longer
		// places into p.
		n, m := c.copyUnread(p, &v)
		if advertised {
			s.end()
			c.readPlaced()
		}
		c.consume(n, m, true)
		return n + m, nil
	}
}

// endRead ends a Read that copied nothing out of the ring: it returns the bytes the
// peer placed into the Read's buffer, if it advertised it and they came (place.go),
// else err. Before it withdraws an advertisement, it gives back the Read's spinning
// slot: the answer may have to be waited for, and the poller's goroutine reaps it only
// once nobody spins (endSpin).
func (c *Conn) endRead(s *spin, advertised bool, err error) (int, error) {
	n := 0
	if advertised {
		s.end()
		n = c.readPlaced()
	}
	c.consume(0, 0, true)
	if n > 0 {
		return n, nil
	}
	return 0, err
}

// readPlaced ends a Read that advertised p: it returns the bytes the peer placed, if
// the answer was a placement, after the buffer is deregistered. An advertisement still
// usable is withdrawn first: a cancel, then a wait for the answer, which comes within
// a round trip, or for the QP to leave service (failure, teardown), after which nothing
// lands. Called with rmu held, without mu, and without a spinning slot (endSpin).
func (c *Conn) readPlaced() int {
	pl := &c.place
	c.mu.Lock()
	defer c.mu.Unlock()
	for pl.mr != nil {
		if pl.placed == 0 && c.fc.AdvertUsable() && !c.qpDownLocked() {
			if pl.cancelTimer == nil {
				c.fc.CancelAdvert()
				c.postControlLocked()
				pl.cancelTimer = time.NewTimer(placeCancelTimeout)
			}
			c.readParked = true
			parkChan(&c.readable)
			ch := c.readable
			c.mu.Unlock()
			c.parking()
			select {
			case <-ch: // an answer, a failure and teardown signal it
				c.unparked()
			case <-pl.cancelTimer.C:
				c.unparked()
				c.mu.Lock()
				c.failLocked(fmt.Errorf("%w: the peer did not answer the withdrawal of a read buffer within %v", ErrProtocol, placeCancelTimeout))
				c.mu.Unlock()
			}
			c.mu.Lock()
			c.readParked = false
			continue
		}
		if pl.cancelTimer != nil {
			pl.cancelTimer.Stop()
			pl.cancelTimer = nil
		}
		pl.mr = nil
	}
	n := pl.placed
	pl.placed = 0
	return n
}

// placedLocked is how many bytes were placed into this Read's buffer: non-zero once the
// answer to its advertisement was a placement.
func (c *Conn) placedLocked() int {
	if c.place.mr == nil {
		return 0
	}
	return c.place.placed
}

// qpDownLocked reports whether the QP has left service, so that the peer can write
// into nothing any more: a failure moved it to ERROR, or teardown did.
func (c *Conn) qpDownLocked() bool { return c.qpErrored || c.direct.torn }

// releasePlaceLocked deregisters the advertisement buffer and the cached buffers at
// teardown, once the QP is in ERROR.
func (c *Conn) releasePlaceLocked() error {
	pl := &c.place
	pl.mr = nil
	var first error
	for _, mr := range [...]*verbs.MR{&pl.out, &pl.cache[0].mr, &pl.cache[1].mr} {
		if *mr == nil {
			continue
		}
		if err := (*mr).Close(); err != nil && first == nil {
			c.taintPD()
			first = fmt.Errorf("rdma: close: deregister a read buffer: %w", err)
		}
		*mr = nil
	}
	for i := range pl.cache {
		pl.cache[i] = directMR{}
	}
	return first
}

// canPlace reports whether the endpoint takes part in direct placement: its PD
// registers the application's memory, its provider does not pin (see above), and
// Options.NoPlacement is not set.
func (ep *Endpoint) canPlace() bool {
	return !ep.opts.NoPlacement && placeRegistrar(ep.pd) != nil && (ep.dev == nil || !ep.pinsMemory())
}

// placeRegistrar is the endpoint's PD as a registrar of the application's memory, or
// nil: then this side cannot take part in direct placement.
func placeRegistrar(pd verbs.PD) verbs.MemoryRegistrar {
	reg, _ := pd.(verbs.MemoryRegistrar)
	return reg
}
