package rdma

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
)

// Read copies buffered bytes into p: first those spilled out of the ring, which are the
// older, then those still in the ring. It returns buffered bytes even after the
// connection failed, so nothing that arrived is lost; then io.EOF after the peer's FIN,
// or the failure.
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(p) == 0 {
		return 0, c.readErr()
	}
	if c.place.reg != nil && len(p) >= placeMinRead {
		return c.readPlacing(p) // place.go
	}
	s := spin{c: c, answer: c.awaitsAnswer()}
	defer s.end()
	for {
		if c.rdl.passed() {
			c.consume(0, 0, true)
			return 0, os.ErrDeadlineExceeded
		}
		park := s.parking()
		if !park && s.quiet() && s.more() {
			c.pollWaiting(s.polls)
			continue
		}
		seen := c.readChanges.Load()
		var v unreadView
		err := c.unread(&v, park, nil, false)
		if err != nil {
			c.consume(0, 0, true)
			return 0, err
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
				c.consume(0, 0, true)
				return 0, err
			}
			continue
		}
		n, m := c.copyUnread(p, &v)
		c.consume(n, m, true)
		return n + m, nil
	}
}

// copyUnread copies what v names into p, spilled bytes first, and returns how many of
// each it copied. Nothing moves the bytes while a Read is in progress: it copies
// without mu.
func (c *Conn) copyUnread(p []byte, v *unreadView) (fromSpill, fromRing int) {
	n := c.spill.copyOut(p[:min(len(p), v.spilled)])
	m := 0
	if n == v.spilled && n < len(p) {
		m = copy(p[n:], v.ring[v.first.Off:v.first.Off+v.first.Len])
		if n+m < len(p) && v.second.Len > 0 {
			m += copy(p[n+m:], v.ring[:v.second.Len])
		}
	}
	return n, m
}

// WriteTo writes the buffered bytes straight to w, spilled ones and then the ring's,
// without an intermediate buffer, until the peer's FIN (returning nil) or an error.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	var total int64
	s := spin{c: c, answer: c.awaitsAnswer()}
	defer s.end()
	for {
		if c.rdl.passed() {
			c.consume(0, 0, true)
			return total, os.ErrDeadlineExceeded
		}
		park := s.parking()
		var v unreadView
		err := c.unread(&v, park, nil, false)
		if err == io.EOF {
			c.consume(0, 0, true)
			return total, nil
		}
		if err != nil {
			c.consume(0, 0, true)
			return total, err
		}
		if v.empty() {
			if s.more() {
				c.pollWaiting(s.polls)
				continue
			}
			if !park {
				continue // look once more, marked parked
			}
			if err := c.waitReadable(); err != nil {
				c.consume(0, 0, true)
				return total, err
			}
			continue
		}
		s.end() // progress: the next wait spins afresh
		var n, m int
		var werr error
		if v.spilled > 0 {
			n, werr = writeCounted(w, c.spill.peek())
		} else {
			m, werr = writeCounted(w, v.ring[v.first.Off:v.first.Off+v.first.Len])
			if werr == nil && v.second.Len > 0 {
				var k int
				k, werr = writeCounted(w, v.ring[:v.second.Len])
				m += k
			}
		}
		total += int64(n + m)
		if werr != nil {
			c.consume(n, m, true)
			return total, werr
		}
		c.consume(n, m, false)
	}
}

// errInvalidWrite is WriteTo's error for a writer that returned an impossible count.
var errInvalidWrite = errors.New("rdma: write to: the writer returned an invalid count")

// writeCounted is w.Write(b) for WriteTo, which consumes from the ring what the writer
// says it took: a count below zero or beyond len(b), which io.Writer forbids, is
// reported as an error and consumes nothing, rather than releasing bytes that were
// never handed over (as io.Copy does with such a writer).
func writeCounted(w io.Writer, b []byte) (int, error) {
	k, err := w.Write(b)
	if k < 0 || k > len(b) {
		return 0, fmt.Errorf("%w: %d of %d bytes", errInvalidWrite, k, len(b))
	}
	return k, err
}

type piece struct{ Off, Len int }

// unreadView is what a Read may copy out: spilled bytes, then pieces of ring, the
// memory they are in (the old ring's, after a switch, while it holds bytes); or the
// bytes the peer placed into the Read's buffer (place.go), which come first.
type unreadView struct {
	spilled       int
	first, second piece
	ring          []byte
	placed        int
	advertised    bool // this look advertised the Read's buffer
}

func (v *unreadView) empty() bool { return v.spilled == 0 && v.first.Len == 0 }

// unread marks a read in progress (so nothing is spilled under it) and sets v to the
// buffered bytes; when there are none, it returns the reason no more will come (io.EOF,
// a failure, net.ErrClosed), or nil to wait. With park, a caller that finds nothing
// is about to park on readable: it is marked parked in the same critical section, so
// an arrival after this look signals it. p, if not nil, is the Read's buffer, which it
// advertises when it finds nothing (place.go): a Read passes it to its first look only;
// advertised, that an earlier look did, and the bytes placed are to be looked for.
//
// It fills the caller's v rather than return one: a view built field by field and then
// returned, a copy of its 80 bytes, stalled the copy's wide loads on the fields' narrow
// stores, 2% of the CPU of a 64-byte round trip on soft.
func (c *Conn) unread(v *unreadView, park bool, p []byte, advertised bool) error {
	*v = unreadView{}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readParked = false
	if advertised {
		if v.placed = c.placedLocked(); v.placed > 0 {
			return nil
		}
	}
	if c.closing {
		return net.ErrClosed
	}
	c.reading = true
	f, s := c.fc.Unread()
	v.spilled, v.first, v.second, v.ring = c.spill.len(), piece(f), piece(s), c.readRingLocked()
	if !v.empty() {
		return nil
	}
	err := c.readErrLocked()
	if err == nil && len(p) >= placeMinRead && c.canAdvertiseLocked(len(p)) {
		v.advertised = c.advertiseLocked(p)
	}
	c.readParked = park && err == nil
	if c.readParked {
		parkChan(&c.readable)
	}
	return err
}

func (c *Conn) readErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return net.ErrClosed
	}
	return c.readErrLocked()
}

// readErrLocked is why a Read with nothing buffered returns now, or nil to wait.
func (c *Conn) readErrLocked() error {
	switch {
	case c.fc.PeerClosed():
		return io.EOF
	case c.err != nil:
		return c.err
	}
	return nil
}

// consume releases the bytes the application has taken, fromSpill out of the spill
// buffer and then fromRing out of the ring, and sends any credit update now due. done
// ends the read in progress: what arrived meanwhile may be spilled now.
func (c *Conn) consume(fromSpill, fromRing int, done bool) {
	c.mu.Lock()
	if done {
		c.reading = false
	}
	if c.closing {
		release := false
		if done {
			c.spill.release() // Close left it to this Read
			release = c.lastToLeaveLocked()
		}
		c.mu.Unlock()
		if release {
			// Close tore down under this Read and left the endpoint to it (see
			// teardown). Close has returned already: a release error has nobody to
			// reach, and the resources are gone either way.
			_ = c.ep.release()
		}
		return
	}
	defer c.mu.Unlock()
	c.spill.discard(fromSpill)
	if err := c.fc.Consume(fromRing); err != nil {
		c.failLocked(err) // cannot happen: fromRing ≤ what Unread returned
		return
	}
	c.freeOldRingLocked()
	c.postControlLocked()
	if !done {
		c.spillLocked() // a WriteTo in progress: nothing spills (reading)
		return
	}
	// At the end of a read, a peer that still holds ring credit sends again, and that
	// arrival asks again (flowctl's Spillable): the bytes stay in the ring for a reader
	// that keeps reading. A peer without credit may be blocked: give back what was
	// consumed at once (an early credit update), and spill only when there is nothing
	// to give back, so that a writer goes on although nobody reads any more.
	if c.fc.PeerRingCredit() == 0 && !c.creditNowLocked() {
		c.spillLocked()
		c.postControlLocked()
	}
}

// creditNowLocked posts an early credit update (flowctl's CreditNow) and reports
// whether it did.
func (c *Conn) creditNowLocked() bool {
	if c.err != nil || c.sqPosted-c.sqDone >= c.sqDepth {
		return false
	}
	m, ok := c.fc.CreditNow()
	if !ok {
		return false
	}
	c.fillWR(0, m, 0, false)
	c.wrEnd[0] = c.stageTail
	return c.postLocked(1) == nil
}

// spillLocked moves buffered bytes out of the ring into the spill buffer, as many as
// flowctl's Spillable says, unless a read is in progress. Their ring credit then goes
// back to the peer with the next message or update, so a writer keeps going although
// the application does not read, until the spill buffer is full (see "Buffering" in the
// package docs). Called with mu held, after every data arrival and at the end of every
// read that leaves the peer without ring credit and nothing to give back (consume).
func (c *Conn) spillLocked() {
	if c.reading || c.closing || c.err != nil {
		return
	}
	n := c.fc.Spillable(c.spillMax - c.spill.len())
	for n > 0 {
		// Unread names one ring at a time: the old one first, after a switch.
		ring := c.readRingLocked()
		f, s := c.fc.Unread()
		k := min(n, f.Len+s.Len)
		m := min(k, f.Len)
		c.spill.write(ring[f.Off : f.Off+m])
		if k > m {
			c.spill.write(ring[s.Off : s.Off+k-m])
		}
		if err := c.fc.Consume(k); err != nil {
			c.failLocked(err) // cannot happen: k ≤ what Unread returned
			return
		}
		c.spilled += uint64(k)
		n -= k
		c.freeOldRingLocked()
	}
}

// waitReadable waits until something arrives, the read deadline passes, or the Conn
// closes.
func (c *Conn) waitReadable() error {
	dl := c.rdl.parkOn()
	select {
	case <-dl:
		return os.ErrDeadlineExceeded
	default:
	}
	c.parking()
	defer c.unparked()
	select {
	case <-c.readable: // made by unread, which marked this Read parked; Close signals it too
		return nil
	case <-dl:
		return os.ErrDeadlineExceeded
	}
}
