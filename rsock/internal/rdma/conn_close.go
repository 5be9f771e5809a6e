package rdma

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// The control channel carries, after the upgrade, only keepalive bytes; its real message
// is its end. A peer that closes its Conn sends its FIN on the QP and waits for it to
// complete before closing the control channel, so the FIN is in our CQ when we see the
// close. A control channel that ends without a FIN having arrived within closeGrace
// means the peer process died, and fails the Conn.
var ctrlKeepalive = [1]byte{'K'}

// closeGrace is how long after the control channel closes the peer's FIN may still be
// on its way through our poller.
const closeGrace = 500 * time.Millisecond

// maxCloseGrace bounds the wait for the FIN while the poller is behind.
const maxCloseGrace = 30 * time.Second

// CloseWrite sends a FIN after all data written so far: the peer reads io.EOF after the
// bytes. Later Writes fail. Reads are unaffected.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return net.ErrClosed
	}
	if !c.writeClosed {
		c.writeClosed = true
		c.fc.CloseWrite()
		c.postControlLocked()
	}
	return nil
}

// Close unblocks pending Reads and Writes, sends a FIN if none was sent, waits for every
// posted write and the FIN to complete (so each byte Write reported is in the peer's
// ring, and the peer will read them and then io.EOF), then tears down the QP and the
// registered memory, drops unread bytes and closes the control channel (its reader does,
// as it wakes, after Close has returned).
//
// The wait does not depend on the peer's application: the peer's engine takes the bytes
// whether or not anyone reads them (see "Buffering" in the package docs), so it lasts
// one round trip. Only a peer whose device stopped answering makes it last up to the
// linger time (Options.Linger); then Close tears down anyway, and the peer, which has
// not received the FIN, reads an error after the bytes that did arrive, never io.EOF.
//
// Only the first Close does this and reports how it went; later ones return an error
// matching net.ErrClosed, as a closed *net.TCPConn's do.
func (c *Conn) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		c.closeErr = c.close()
	})
	if !first {
		return fmt.Errorf("rdma: close: %w", net.ErrClosed)
	}
	return c.closeErr
}

func (c *Conn) close() error {
	c.mu.Lock()
	c.closing = true
	if !c.writeClosed {
		c.writeClosed = true
		c.fc.CloseWrite()
		c.postControlLocked()
	}
	c.readChanges.Add(1)
	signal(c.readable) // a waiter sees closing (and sendKeepalive sends nothing more)
	signal(c.writable)
	c.mu.Unlock()
	undelivered := c.drain()
	c.mu.Lock()
	if !c.reading {
		c.spill.release() // else the Read in progress releases it when it ends
	}
	c.startOnce.Do(func() {}) // never started: no reader to hand over to, and none to start
	handOver := c.readerRunning
	c.readerFinishes = handOver
	c.mu.Unlock()
	err := c.teardown()
	if handOver {
		// The control reader, woken here, closes the control channel as it returns:
		// closing it from here would wait for that reader to wake and leave its Read
		// (a socket is closed once no call is in it), and tells the caller nothing
		// about its bytes, which drain has settled. The peer sees the channel close
		// after the FIN's completion, as it must.
		//
		// The channel's end goes out now, though: a half-close takes nothing from the
		// reader, and the peer, whose own Close may be waiting for that end (a Close
		// that follows ours: conn_ctrlpeek.go), sees it without waiting for this
		// reader's wake-up. Nothing is written on the channel after a Close.
		if cw, ok := c.ctrl.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		c.ctrl.SetReadDeadline(aLongTimeAgo)
		return errors.Join(undelivered, err)
	}
	return errors.Join(undelivered, err, c.closeControl())
}

// closeControl closes the control channel at the end of a Close, and stops the grace
// timer its end may have started: run by the control reader as it returns when it was
// running as Close began, else by Close.
func (c *Conn) closeControl() error {
	err := ignoreClosed(c.ctrl.Close())
	c.mu.Lock()
	if c.graceTimer != nil {
		c.graceTimer.Stop()
	}
	c.mu.Unlock()
	return err
}

// Abandon tears the Conn down without a FIN and without touching the control channel,
// which stays the caller's: for a handshake that connected the QP but then fell back.
// The Conn must not have been started.
func (c *Conn) Abandon() error {
	var err error
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing = true
		c.readChanges.Add(1)
		signal(c.readable) // a waiter sees closing
		signal(c.writable)
		if !c.reading {
			c.spill.release()
		}
		c.mu.Unlock()
		err = c.teardown()
	})
	return err
}

// teardown stops the QP and its completions and releases every resource. A Read or
// WriteTo in progress may still be copying out of the ring (it copies without mu, and
// WriteTo hands ring memory to its writer), and a ReadFrom may be reading into the
// staging buffer (its reader's Read, outside mu): then the registered memory, the QP
// and the device reference are released by the last of them as it ends (consume,
// returnStage), never under it, since some providers unmap registered memory as they
// release it. The Read ends promptly: closing is set, and it returns net.ErrClosed at
// its next step; the ReadFrom, when its reader's Read returns.
//
// The QP stops before any region it may reach is released: destroyed at once when
// nothing is left in the ring or the staging buffer (the common case), else moved to
// ERROR now and destroyed by whoever releases the endpoint. Moving a QP to ERROR only
// to destroy it just after would flush every receive WQE still posted, a completion
// each that the poller then reaps and drops (on soft, the move alone was 2% of the CPU
// of rsockperf's setup workload), and on a device it is a command besides. (closing
// is set, so neither a Read nor a ReadFrom can begin to hold the ring or the staging
// buffer now.)
func (c *Conn) teardown() error {
	var errs []error
	c.mu.Lock()
	left := c.reading || c.stageLent
	c.mu.Unlock()
	if left {
		if err := c.qp.ToError(); err != nil {
			errs = append(errs, fmt.Errorf("rdma: close: QP to ERROR: %w", err))
		}
	}
	c.ep.poller.detach(c.qp.QPN()) // no completion is dispatched to the Conn from here
	c.mu.Lock()
	// Again: a Read or ReadFrom seen above may have ended since, leaving the release
	// to us (it releases only what releaseLeft hands it).
	left = c.reading || c.stageLent
	c.releaseLeft = left
	if !left {
		if err := c.ep.closeQP(); err != nil {
			errs = append(errs, fmt.Errorf("rdma: close: %w", err))
		}
	}
	if err := c.releaseDirectLocked(); err != nil { // zcopy.go
		errs = append(errs, err)
	}
	if err := c.releasePlaceLocked(); err != nil { // place.go
		errs = append(errs, err)
	}
	c.readChanges.Add(1)
	signal(c.readable) // a Read withdrawing its advertisement: nothing lands any more
	c.mu.Unlock()
	if !left {
		if err := c.ep.release(); err != nil {
			errs = append(errs, fmt.Errorf("rdma: close: %w", err))
		}
	}
	return errors.Join(errs...)
}

// dataAckedLocked reports whether the peer's device acknowledged every byte Write
// accepted: the staging buffer holds none still in flight, no older staging buffer
// waits for its sends, and no direct write's WRs are outstanding.
func (c *Conn) dataAckedLocked() bool {
	return c.stageHead == c.stageTail && (c.ep == nil || c.ep.oldSend == nil) &&
		c.sqDone >= c.direct.until // and no direct write (zcopy.go) is in flight
}

// drain waits until the FIN has been posted and has completed (and with it, in order,
// every write before it), the Conn fails, the peer is gone, or the linger time passes.
//
// It returns an error, which Close reports, when the Conn failed with bytes Write
// accepted that the peer's device never acknowledged, or when the linger time passed
// before the FIN (and every write before it) was acknowledged: bytes may then be lost,
// or the peer may never see the stream's end (as with a TCP socket reset, or closed
// with SO_LINGER and a timeout). A nil error from Close means every byte Write accepted
// reached the peer's ring. It returns nil when Linger is negative: the caller chose not
// to wait.
func (c *Conn) drain() error {
	if c.linger < 0 {
		return nil
	}
	// The FIN's completion usually follows at once: the wait polls for it first, as a
	// waiting Write does (conn_poll.go), and only a longer one parks, with a timer. The
	// timer starts with the first park and is stopped, and the spin ended, by one
	// deferred call outside the loop: a defer inside it would be allocated on the heap.
	s := spin{c: c}
	var t *time.Timer
	defer func() {
		s.end()
		if t != nil {
			t.Stop()
		}
	}()
	for {
		c.mu.Lock()
		delivered := c.finPosted && c.sqDone > c.finID
		failed, gone := c.err, c.peerGone
		peerClosed := c.fc.PeerClosed()
		unacked := c.sqPosted - c.sqDone
		dataAcked := c.dataAckedLocked()
		// The channel to park on is made only by a drain that has spun out, and before
		// the check that precedes the park, so that no signal after it is lost (a
		// signal to a nil channel is dropped). Most drains end while polling, and so a
		// Conn that closes at once makes none.
		if s.parking() {
			parkChan(&c.drained)
		}
		drained := c.drained
		c.mu.Unlock()
		switch {
		case delivered || (gone && failed == nil):
			return nil
		case failed != nil && (unacked == 0 || dataAcked):
			// Every byte Write accepted was acknowledged (what is left unacknowledged,
			// the FIN or a control message, carries none); the failure was reported.
			return nil
		case failed != nil:
			return fmt.Errorf("rdma: close: %d work requests (writes or the FIN) never acknowledged by the peer, so bytes Write accepted may be lost: %w", unacked, failed)
		}
		// A Close that follows the peer's looks for the control channel's end itself
		// (conn_ctrlpeek.go): as it starts, every ctrlPeekEvery polls, and before it
		// parks.
		if peerClosed && (s.polls%ctrlPeekEvery == 0 || s.parking()) && c.controlEnded() {
			c.mu.Lock()
			c.peerGone = true
			c.mu.Unlock()
			continue
		}
		if t == nil && s.more() {
			c.pollWaiting(s.polls)
			continue
		}
		if drained == nil {
			continue // spun out now: the next check makes the channel
		}
		if t == nil {
			t = time.NewTimer(c.linger)
		}
		c.parking()
		select {
		case <-drained:
			c.unparked()
		case <-t.C:
			c.unparked()
			return fmt.Errorf("rdma: close: the peer did not acknowledge the bytes written and the FIN within the linger time of %v: %w", c.linger, ErrLingerTimeout)
		}
	}
}

// readControl watches the control channel until it ends. Bytes on it are keepalives;
// with keepalives on, and once the peer has sent one, three silent periods are a
// timeout.
//
// It also keeps this end's keepalive periods: its Read's deadline is the next period's
// end (or the peer's silence timeout, if sooner), and a Read cut short by it sends the
// period's keepalive (tickKeepalive). A timer of the Conn's own would cost every
// connection its allocation, and a callback's.
//
// When Close, its drain over, finds it running, it closes the channel (closeControl) as
// it returns: Close sets readerFinishes and then a deadline in the past, so the reader,
// which checks readerFinishes after setting its own deadline, either returns at once or
// has its Read cut short.
func (c *Conn) readControl() {
	defer c.readerReturns()
	buf := &c.ctrlBuf // in the Conn: a local array would escape into ctrl.Read
	peerKeepsAlive := false
	// tick is when this end's next keepalive is due (zero: none is), silentAt when the
	// peer's silence becomes a timeout.
	var tick, silentAt time.Time
	if c.kaPeriod > 0 {
		tick = time.Now().Add(c.kaPeriod)
	}
	for {
		if c.kaPeriod > 0 {
			// Silence is a timeout only once the peer has shown it sends keepalives: a
			// peer configured without them must not be cut off for being idle.
			at := tick
			if peerKeepsAlive && (at.IsZero() || silentAt.Before(at)) {
				at = silentAt
			}
			c.ctrl.SetReadDeadline(at)
		}
		c.mu.Lock()
		failed, closing, handedOver, kaOff := c.err != nil, c.closing, c.readerFinishes, c.kaOff
		c.mu.Unlock()
		if handedOver {
			return // and close the channel (readerReturns)
		}
		// A Close's drain still needs this reader: the channel's end tells it that
		// the peer is gone (controlLost).
		if failed {
			if !closing {
				c.ctrl.Close() // tell the peer: its control reader sees the close
			}
			return
		}
		if kaOff {
			tick = time.Time{}
		}
		n, err := c.ctrl.Read(buf[:])
		if n > 0 {
			peerKeepsAlive = true
			silentAt = time.Now().Add(3 * c.kaPeriod)
		}
		for _, b := range buf[:n] {
			if b != ctrlKeepalive[0] {
				c.mu.Lock()
				c.failLocked(fmt.Errorf("%w: byte %#x on the control channel", ErrProtocol, b))
				c.mu.Unlock()
				break
			}
		}
		if err == nil {
			continue
		}
		c.mu.Lock()
		failed, handedOver = c.err != nil, c.readerFinishes
		c.mu.Unlock()
		if failed || handedOver {
			continue // woken by failLocked or Close: see above
		}
		if c.kaPeriod > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			now := time.Now()
			switch {
			case peerKeepsAlive && !now.Before(silentAt):
				c.controlLost(err) // the peer's silence: a timeout
				return
			case !tick.IsZero() && !now.Before(tick):
				tick = now.Add(c.kaPeriod)
				c.tickKeepalive()
			}
			continue
		}
		c.controlLost(err) // which, in a Close, only lets its drain end
		return
	}
}

// readerReturns ends the control reader: it closes the control channel for a Close that
// handed that over. Close's caller has its answer already; an error closing a socket
// tells it nothing about its bytes.
func (c *Conn) readerReturns() {
	c.mu.Lock()
	c.readerRunning = false
	finish := c.readerFinishes
	c.mu.Unlock()
	if finish {
		c.closeControl()
	}
}

// controlLost handles the end of the control channel: writes fail from now on, and
// reads end with io.EOF if the peer's FIN arrives within closeGrace, else with the
// loss.
func (c *Conn) controlLost(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peerGone = true
	signal(c.drained) // a Close draining toward a peer that is gone need not wait
	if c.closing {
		return
	}
	signal(c.writable)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.failLocked(fmt.Errorf("%w: nothing from the peer for %v", ErrKeepaliveTimeout, 3*c.kaPeriod))
		return
	}
	if c.fc.PeerClosed() {
		return
	}
	// A control channel that ended cleanly (io.EOF) is not wrapped: the stream did not
	// end cleanly, and errors.Is(err, io.EOF) must not say it did.
	lost := fmt.Errorf("%w: %w", ErrControlLost, err)
	if errors.Is(err, io.EOF) {
		lost = fmt.Errorf("%w: closed by the peer before its FIN arrived", ErrControlLost)
	}
	// The peer's FIN completed before it closed the channel, so it is in our CQ or
	// dispatched already, unless the peer died. Give the poller closeGrace to reach it,
	// and more while it is still behind (a busy CQ, a loaded machine), up to
	// maxCloseGrace: only a poller that has caught up and found no FIN proves the loss.
	var p *poller // nil for a Conn built without an Endpoint (tests): no extension
	var mark uint64
	if c.ep != nil && c.ep.poller != nil {
		p = c.ep.poller
		mark = p.emptied.Load()
	}
	deadline := time.Now().Add(maxCloseGrace)
	check := func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch {
		case c.fc.PeerClosed() || c.closing:
		case p != nil && !p.caughtUpSince(mark) && time.Now().Before(deadline):
			c.graceTimer.Reset(closeGrace) // mark stands: no empty poll since it
		default:
			c.failLocked(lost)
		}
	}
	c.graceTimer = time.AfterFunc(closeGrace, check)
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
