package rdma

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// Write copies p into the registered staging buffer and writes it into the peer's ring
// with RDMA_WRITE_WITH_IMM, as fast as the peer's credits allow. It returns when all of
// p is posted: on RC, posted bytes reach the peer unless the connection fails. A large
// p the provider can register is posted from p itself instead (zcopy.go).
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.markWrote()
	if c.place.reg != nil && len(p) >= placeMinRead {
		c.awaitAdvert(len(p)) // place.go
	}
	if n, ok, err := c.writeDirect(p); ok { // large, and the provider can post from p (zcopy.go)
		return n, err
	}
	n := 0
	for {
		m, err := c.writeSome(p[n:], nil)
		n += m
		if err != nil || n == len(p) {
			return n, err
		}
	}
}

// ReadFrom reads from r straight into the staging buffer and posts it, saving the copy
// through an intermediate buffer that io.Copy would make.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.markWrote()
	var total int64
	for {
		m, err := c.writeSome(nil, r)
		total += int64(m)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// writeSome posts one chunk: from p, or read from r when r is non-nil. It waits until
// at least one byte can be posted, and returns the bytes posted. With r, io.EOF from r
// is returned once nothing more was read. Called with wmu held.
//
// Its one return keeps the two defers open-coded (inlined at the return): the compiler
// puts defers on the stack, a runtime call each and another at return, in a function
// whose returns times defers exceed 15, as the loop's did. On soft that was 39 ns, a
// ninth, of each 64-byte Write (BenchmarkPingPong64BOneGoroutine's CPU profile).
func (c *Conn) writeSome(p []byte, r io.Reader) (int, error) {
	if r == nil && len(p) == 0 {
		return 0, c.writeErr()
	}
	s := spin{c: c}
	defer s.end()
	var stall creditStall
	defer stall.end(c) // outside mu: the hook may call back into c
	return c.writeWaiting(p, r, &s, &stall)
}

// writeWaiting is writeSome's loop: it looks for room, posts, or waits with s's spin,
// recording a wait for credit in stall.
func (c *Conn) writeWaiting(p []byte, r io.Reader, s *spin, stall *creditStall) (int, error) {
	for {
		if c.wdl.passed() {
			return 0, os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		c.writeParked = false
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		if r == nil && c.place.reg != nil { // place.go
			if k := c.placeRoomLocked(); k > 0 {
				n, err := c.placeStagedLocked(p, k)
				if n > 0 || err != nil {
					c.mu.Unlock()
					return n, err
				}
			}
		}
		room := c.writeRoomLocked()
		if room > 0 {
			if r == nil {
				n, err := c.postDataLocked(p[:min(len(p), room)])
				c.mu.Unlock()
				return n, err
			}
			// Read into staging outside mu: only writers touch staging above
			// stageTail, and wmu keeps them out. Then post all that was read.
			buf := c.stageWindow(room)
			c.stageLent = true // a Close meanwhile leaves the endpoint's release to us (teardown)
			c.mu.Unlock()
			s.end() // r.Read may block: no spinning slot held meanwhile (endSpin)
			m, rerr := r.Read(buf)
			c.returnStage()
			err := c.postStaged(m) // fails once closed: nothing read is posted then
			if err != nil {
				return 0, err
			}
			if m == 0 && rerr == nil {
				continue
			}
			return m, rerr
		}
		if c.fc.Writable() == 0 {
			stall.noCredit()
		}
		if err := c.awaitRoomLocked(s); err != nil {
			return 0, err
		}
	}
}

// returnStage ends ReadFrom's use of the staging buffer outside mu. A Close that tore
// down meanwhile left the endpoint to the last of this and a Read in progress
// (teardown): the staging buffer is registered memory, unmapped on release by some
// providers, and must outlive the Read into it.
func (c *Conn) returnStage() {
	c.mu.Lock()
	c.stageLent = false
	release := c.closing && c.lastToLeaveLocked()
	c.mu.Unlock()
	if release {
		_ = c.ep.release() // Close has returned: nobody to tell, and it is gone either way
	}
}

// lastToLeaveLocked reports whether the endpoint's release was left to a Read or
// ReadFrom (teardown) and none is in progress any more: the caller, which just ended
// one, releases it. It reports true once.
func (c *Conn) lastToLeaveLocked() bool {
	if !c.releaseLeft || c.reading || c.stageLent {
		return false
	}
	c.releaseLeft = false
	return true
}

// writeErr reports why no byte may be written now, or nil.
func (c *Conn) writeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeErrLocked()
}

func (c *Conn) writeErrLocked() error {
	switch {
	case c.closing:
		return net.ErrClosed
	case c.writeClosed:
		return errWriteClosed
	case c.err != nil:
		return c.err
	case c.peerGone:
		return ErrPeerClosed
	}
	return nil
}

var errWriteClosed = &net.OpError{Op: "write", Net: "rdma", Err: os.ErrClosed}

// writeRoomLocked is how many bytes one data post may carry now: limited by flow
// control, the send queue (a reservation may take two WRs), and contiguous staging.
func (c *Conn) writeRoomLocked() int {
	if c.sqDepth-(c.sqPosted-c.sqDone) < 2 {
		return 0
	}
	w := min(c.fc.Writable(), c.maxChunk)
	contig := c.stageContig()
	if contig < w && len(c.stage) < c.stageMax && c.ep != nil && c.ep.oldSend == nil {
		c.growStageLocked()
		contig = c.stageContig()
	}
	return min(w, contig)
}

// stageContig is the largest contiguous staging span free at the tail. When the tail
// segment to the buffer's end is shorter than the free span at its start, the tail
// skips to the start (the skipped bytes free with the next completion).
func (c *Conn) stageContig() int {
	size := uint64(len(c.stage))
	free := size - (c.stageTail - c.stageHead)
	off := c.stageTail % size
	toEnd := size - off
	if toEnd >= free {
		return int(free)
	}
	if atStart := free - toEnd; atStart > toEnd {
		c.stageTail += toEnd
		return int(atStart)
	}
	return int(toEnd)
}

// stageWindow returns n bytes of staging at the tail (n ≤ stageContig()).
func (c *Conn) stageWindow(n int) []byte {
	off := int(c.stageTail % uint64(len(c.stage)))
	return c.stage[off : off+n]
}

// postStaged posts n bytes already read into staging at its tail, waiting for credit
// and send-queue room as needed. Unlike a Write, it cannot give up part way: the bytes
// were consumed from their reader.
func (c *Conn) postStaged(n int) error {
	s := spin{c: c}
	defer s.end()
	var stall creditStall
	defer stall.end(c) // outside mu: the hook may call back into c
	for n > 0 {
		c.mu.Lock()
		c.writeParked = false
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return err
		}
		credit := c.fc.Writable() > 0
		if !credit {
			stall.noCredit()
		}
		if c.sqDepth-(c.sqPosted-c.sqDone) >= 2 && credit {
			m, err := c.postStagedLocked(n)
			n -= m
			if err != nil {
				c.mu.Unlock()
				return err
			}
			if n == 0 {
				c.mu.Unlock()
				return nil
			}
		}
		if err := c.awaitRoomLocked(&s); err != nil {
			return err
		}
	}
	return nil
}

// postDataLocked copies p (len(p) ≤ writeRoomLocked()) into staging and posts it.
func (c *Conn) postDataLocked(p []byte) (int, error) {
	copy(c.stageWindow(len(p)), p)
	return c.postStagedLocked(len(p))
}

// postStagedLocked reserves n bytes already copied at the staging tail and posts them
// as one or two writes. It may reserve fewer than n if credit shrank (control messages
// share the WQE credit); the rest stays unposted and will be copied again.
func (c *Conn) postStagedLocked(n int) (int, error) {
	res, err := c.fc.ReserveData(n)
	if err != nil {
		c.failLocked(protocolError(err))
		return 0, c.err
	}
	for i := range res.Count {
		m := res.Msgs[i]
		c.fillWR(i, m, c.stageAddr+c.stageTail%uint64(len(c.stage)), false)
		c.stageTail += uint64(m.Len)
		c.wrEnd[i] = c.stageTail
	}
	if err := c.postLocked(res.Count); err != nil {
		return 0, err
	}
	c.stats.sent(res.Count, res.Bytes)
	return res.Bytes, nil
}

// fillWR prepares c.wrs[i] to carry message m from staging address addr.
func (c *Conn) fillWR(i int, m flowctl.Msg, addr uint64, forceSignal bool) {
	wr := &c.wrs[i]
	wr.Opcode = verbs.OpRDMAWriteWithImm
	wr.Imm = m.Imm
	wr.RemoteAddr = c.peerRingAddr + uint64(m.Off)
	wr.RKey = c.peerRKey
	wr.Flags = 0
	if m.Len == 0 {
		wr.SGL = nil
	} else {
		c.sges[i][0] = verbs.SGE{Addr: addr, Length: uint32(m.Len), LKey: c.stageKey}
		wr.SGL = c.sges[i][:]
		if m.Len <= c.inline {
			wr.Flags |= verbs.SendInline
		}
	}
	if forceSignal {
		wr.Flags |= verbs.SendSignaled
	}
}

// fillProbeWR makes c.wrs[i] a signaled zero-length RDMA WRITE into the peer's ring:
// a probe the peer's device acknowledges, invisible to flow control.
func (c *Conn) fillProbeWR(i int) {
	wr := &c.wrs[i]
	wr.Opcode = verbs.OpRDMAWrite
	wr.Imm = 0
	wr.RemoteAddr = c.peerRingAddr
	wr.RKey = c.peerRKey
	wr.SGL = nil
	wr.Flags = verbs.SendSignaled
}

// postLocked posts c.wrs[:n], whose staging bytes end at c.wrEnd[:n], numbering them
// and deciding which are signaled: by need, so that a writer waiting for staging or
// send-queue space always has a completion coming, and no more often. That is every
// signalEvery-th WR (send-queue slots free only with a signaled completion), and, once
// half the staging buffer or more is in flight, the first WR that ends a quarter of the
// buffer or more past the last signaled one. A writer out of staging then has a
// signaled WR in flight whose completion frees at least three quarters of it (or, when
// the last signaled WR has completed, the next WR is signaled: everything in flight
// was posted after it). Each completion costs the poller and the writer.
func (c *Conn) postLocked(n int) error {
	size := uint64(len(c.stage))
	for i := range n {
		wr := &c.wrs[i]
		id := c.sqPosted + uint64(i)
		wr.ID = c.gen | id&seqMask
		c.stageEnd[id%c.sqDepth] = c.wrEnd[i]
		c.sinceSignal++
		if c.sinceSignal >= c.signalEvery ||
			(2*(c.stageTail-c.stageHead) >= size && 4*(c.wrEnd[i]-c.signalTail) >= size) {
			wr.Flags |= verbs.SendSignaled
		}
		if wr.Flags&verbs.SendSignaled != 0 {
			c.sinceSignal = 0
			c.signalTail = c.wrEnd[i]
		}
	}
	if err := c.qp.PostSend(c.wrs[:n]); err != nil {
		c.failLocked(qpError("post send", err))
		return c.err
	}
	c.sqPosted += uint64(n)
	return nil
}

// postControlLocked posts every control message flowctl has due (credit updates, FIN,
// resizes, placement's advertisements and answers), as long as the send queue has room.
func (c *Conn) postControlLocked() {
	for c.err == nil && c.sqPosted-c.sqDone < c.sqDepth {
		if c.closing && c.finPosted {
			return // credit for a stream nobody will read any more
		}
		m, ok := c.fc.NextControl()
		if !ok {
			return
		}
		fin := m.Kind == flowctl.KindFIN
		switch {
		case m.Kind == flowctl.KindResize:
			c.fillResizeWR(m)
		case m.Kind == flowctl.KindPlace && m.Len > 0:
			c.fillAdvertWR(m) // place.go
		default:
			// A FIN is signaled so that Close can wait for it to land.
			c.fillWR(0, m, 0, fin)
		}
		c.wrEnd[0] = c.stageTail
		if fin {
			c.finPosted, c.finID = true, c.sqPosted
		}
		if c.postLocked(1) != nil {
			return
		}
		if m.Kind == flowctl.KindSwitch {
			// Data reserved from now on goes to the peer's new ring.
			c.peerRingAddr, c.peerRKey = c.peerNextAddr, c.peerNextRKey
		}
	}
}

// awaitRoomLocked is a writer's wait once it found no room: one more poll of the CQ
// while its spin lasts, else parked until a completion or credit may have made room.
// Called with mu held, it returns with mu released.
func (c *Conn) awaitRoomLocked(s *spin) error {
	if s.more() {
		c.mu.Unlock()
		c.pollWaiting(s.polls)
		return nil
	}
	c.writeParked = true
	parkChan(&c.writable)
	c.mu.Unlock()
	return c.waitWritable()
}

// waitWritable waits until a completion or credit may have made room, the write
// deadline passes, or the Conn closes.
func (c *Conn) waitWritable() error {
	dl := c.wdl.parkOn()
	select {
	case <-dl:
		return os.ErrDeadlineExceeded
	default:
	}
	c.parking()
	defer c.unparked()
	select {
	case <-c.writable: // made by the writer as it parked; Close signals it too
		return nil
	case <-dl:
		return os.ErrDeadlineExceeded
	}
}

// parkChan makes *ch, one of the Conn's signals, the first time a waiter parks on it
// (see Conn.readable). Called with mu held.
func parkChan(ch *chan struct{}) {
	if *ch == nil {
		*ch = make(chan struct{}, 1)
	}
}

// tickKeepalive sends a keepalive period's keepalive (sendKeepalive), unless the last
// period's is still being sent. It is called by the control reader (readControl). On a
// socket it sends inline: the socket's buffer takes the byte at once. Elsewhere it sends
// from a goroutine of its own: on an unbuffered channel (net.Pipe) a Write waits for
// the peer's reader, which may be sending its own keepalive at that moment.
func (c *Conn) tickKeepalive() {
	c.mu.Lock()
	busy := c.kaSending
	c.kaSending = true
	c.mu.Unlock()
	if busy {
		return
	}
	if _, socket := c.ctrl.(syscall.Conn); socket {
		c.sendKeepalive()
		return
	}
	go c.sendKeepalive()
}

// sendKeepalive runs every keepalive period from Start (tickKeepalive): it checks that
// the peer's device answered since the last periods (see checkSilenceLocked), probes
// the path on the QP, and sends one byte on the control channel.
//
// The probe is a signaled keepalive message when flowctl has credit for one (it
// carries any credit owed), else a zero-length RDMA WRITE, which needs no credit: it
// consumes no receive WQE and writes no byte. Either is acknowledged by the peer's
// device whatever its application does; on a dead path it fails with the QP's retry
// budget (RETRY_EXC_ERR), so an idle connection learns of the path's death within a
// period and that budget, from the start of the connection.
//
// Once the peer's FIN has arrived, or its control channel has closed, the QP is
// neither probed nor watched for silence: nothing more will arrive to wait for, our
// own writes still fail on a dead path, and the peer's QP may already be destroyed, so
// a probe could only fail a stream that ended cleanly. The control byte still goes
// out: a peer that half-closed still expects it.
func (c *Conn) sendKeepalive() {
	defer c.keepaliveSent()
	c.mu.Lock()
	if c.closing || c.err != nil {
		c.mu.Unlock()
		return
	}
	ended := c.peerGone || c.fc.PeerClosed()
	if !ended && c.checkSilenceLocked() {
		c.mu.Unlock()
		return
	}
	if !ended && c.sqPosted-c.sqDone < c.sqDepth {
		if m, ok := c.fc.Keepalive(); ok {
			c.fillWR(0, m, 0, true)
		} else {
			c.fillProbeWR(0)
		}
		c.wrEnd[0] = c.stageTail
		c.postLocked(1)
	}
	c.idleShrinkLocked()
	c.idleShrinkStageLocked()
	c.idleDirectLocked() // zcopy.go
	c.idlePlaceLocked()  // place.go
	c.mu.Unlock()
	c.ctrl.SetWriteDeadline(time.Now().Add(c.kaPeriod))
	if _, err := c.ctrl.Write(ctrlKeepalive[:]); err != nil {
		// No keepalive follows (the peer then times out the silence); a lost channel
		// the control reader reports.
		c.mu.Lock()
		c.kaOff = true
		c.mu.Unlock()
	}
}

// keepaliveSent ends a period's sendKeepalive: the next period may send.
func (c *Conn) keepaliveSent() {
	c.mu.Lock()
	c.kaSending = false
	c.mu.Unlock()
}
