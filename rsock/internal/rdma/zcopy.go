package rdma

import (
	"errors"
	"fmt"
	"net"
	"os"
	"unsafe"

	"github.com/rsockio/rsock/verbs"
)

// Direct writes: a large Write posted from the application's own buffer.
//
// A Write normally copies its bytes into the registered staging buffer and posts them
// from there; the provider (or the NIC) then copies staging into the peer's ring, and
// the peer's Read copies the ring into its buffer: three copies. Where the provider can
// register memory the caller owns (its PD implements [verbs.MemoryRegistrar], as soft
// and ibv do, or [verbs.LocalMemoryRegistrar], as shm does: a direct write's region is
// named only by this side's SGEs), a Write of at least directMinWrite bytes (1 MiB on
// ibv: directpin.go) skips the first: it registers the buffer (through a small
// per-Conn cache keyed by address range, so a buffer written again is registered once),
// posts RDMA_WRITE_WITH_IMMs whose SGEs name the buffer, and returns only once the
// device has completed them, because the application may reuse the buffer as soon as
// Write returns.
//
// Nothing changes on the wire: the peer receives the same messages into the same ring,
// in the same order as staged ones (they share the send queue and flowctl's
// reservations), so it needs no capability and old peers are unaffected. Smaller
// writes, ReadFrom, and providers without the capability use staging as before; so
// does a Write whose buffer the provider refuses (too large for one region, say), and
// every later one once a registration fails for want of resources.
//
// Completion, not posting, ends a direct Write. Each chunk's last WR is signaled, and
// the Write waits until the send queue has retired it: on success, the device read
// every byte; on a failure, the QP is in ERROR and nothing more leaves it. That wait
// observes neither the write deadline nor Close: the device completes or fails what was
// posted within its transport timeouts, whatever the peer's application does. A deadline
// or Close that comes mid-Write stops further posting; the Write then reports the bytes
// posted, as a staged Write does. Only a teardown (Close after its linger time) ends the
// wait early, after the QP was moved to ERROR.
//
// The cache keeps at most directCacheSize buffers registered, the least recently used
// replaced first, and holds a reference to each, so that their memory can be neither
// freed nor reused while registered (Go's heap does not move objects). A buffer no
// Write used for a keepalive period is let go (idleDirectLocked). On a provider that
// pins, registrations are also counted and bounded (directpin.go).
//
// On shm the round trip a direct Write waits for is one to the peer process's Poll or
// goroutine, short next to the copy of 32 KiB it saves. rsockperf, direct against
// staged Writes, ratios to a Unix socket in the same run, two runs each (2026-12-01):
//
//   - both ends in one process: one connection's 64 KiB stream 1.4–1.7× → 2.6–3.4×, its
//     256 KiB one 1.4× → 3.1–3.9×; 16 and 48 connections streaming 64 KiB Writes
//     0.7–0.9× → 0.9–1.1×, 100 and 400 connections 0.30–0.65× → 0.27–0.58×, and 256 KiB
//     Writes 0.3–0.6× → 0.5–1.2× at every count;
//   - between two processes (medians of three): 64 KiB, one connection 2.2× and 5.0×
//     → 4.2× and 5.4×, 64 connections 0.84× and 0.88× → 1.14× and 1.09×; 256 KiB, 16
//     and 64 connections 0.89–1.13× → 1.15–1.67×.
//
// So shm takes directMinWrite, as soft does. (It took 1 MiB while shm's Polls drove 64
// QPs at most: past 32 connections in one process every acknowledgement then waited
// for a doorbell, and 64 KiB direct Writes ran at 0.16–0.28× the staged ones.)
const (
	directMinWrite  = 32 << 10
	directCacheSize = 4
)

// directWriter is a Conn's registration cache and the progress of its direct writes.
// Guarded by Conn.mu.
type directWriter struct {
	looked  bool                  // reg was looked up (from the endpoint's PD)
	reg     verbs.MemoryRegistrar // nil: no capability, or the cache was turned off
	minLen  int                   // smallest direct Write; 0: directMinWrite
	entries [directCacheSize]directMR
	clock   uint64 // use counter, for least-recently-used replacement
	atTick  uint64 // clock at the last keepalive tick (idleDirectLocked)
	until   uint64 // send WRs posted after the last direct WR: sqDone reaches it when all completed
	writing bool   // a direct Write holds an entry, from its lookup to its completions
	torn    bool   // teardown released the QP: no completion will come
}

// directRegistrar is pd as a registrar of the application's buffers for direct
// writes, or nil: a [verbs.MemoryRegistrar], or a [verbs.LocalMemoryRegistrar] (shm),
// since a direct write's region is named only by this side's own SGEs.
func directRegistrar(pd verbs.PD) verbs.MemoryRegistrar {
	switch r := pd.(type) {
	case verbs.MemoryRegistrar:
		return r
	case verbs.LocalMemoryRegistrar:
		return localRegistrar{r}
	}
	return nil
}

// localRegistrar is a verbs.LocalMemoryRegistrar as direct writes use it.
type localRegistrar struct{ verbs.LocalMemoryRegistrar }

func (r localRegistrar) RegMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	return r.RegLocalMemory(buf, access)
}

// directMR is one cached registration: buf is the registered memory, kept referenced.
type directMR struct {
	mr   verbs.MR
	buf  []byte
	used uint64
}

// directRegion returns a registered region holding p and the offset of p in it, or nil
// when p is to be staged. Called with mu held.
func (c *Conn) directRegion(p []byte) (verbs.MR, uint64) {
	d := &c.direct
	if d.torn {
		return nil, 0 // and the endpoint, its PD included, may be released
	}
	if !d.looked {
		d.looked = true
		if c.ep != nil && c.ep.pd != nil {
			d.reg = directRegistrar(c.ep.pd)
		}
		c.directMinLocked() // directpin.go
	}
	if d.reg == nil || len(p) < d.minLen {
		return nil, 0
	}
	d.clock++
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	victim := -1 // the first free entry, else the least recently used
	for i := range d.entries {
		e := &d.entries[i]
		if e.mr == nil {
			if victim < 0 || d.entries[victim].mr != nil {
				victim = i
			}
			continue
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(e.buf)))
		if start >= base && start+uintptr(len(p)) <= base+uintptr(len(e.buf)) {
			e.used, d.writing = d.clock, true
			return e.mr, uint64(start - base)
		}
		if victim < 0 || (d.entries[victim].mr != nil && e.used < d.entries[victim].used) {
			victim = i
		}
	}
	e := &d.entries[victim]
	// No direct WR is in flight between Writes: each waits for its own.
	if !c.dropDirectLocked(e) {
		return nil, 0
	}
	mr, err := c.registerDirect(d.reg, p) // directpin.go: counted where it pins
	if err != nil {
		if !errors.Is(err, verbs.ErrInvalidArgument) {
			d.reg = nil // out of regions, most likely: stage from now on
		} // else this buffer only (too large for one region, say) is staged
		return nil, 0
	}
	*e = directMR{mr: mr, buf: p, used: d.clock}
	d.writing = true
	return mr, 0
}

// idleDirectLocked deregisters, and stops referencing, the cached buffers no Write
// used since the last keepalive tick, so that a buffer written once is not held until
// the Conn closes: a connection with keepalives holds its direct writes' buffers for
// one to two periods after their last use, one without them until it closes (or
// until newer buffers replace them). Called with mu held, from each keepalive period.
func (c *Conn) idleDirectLocked() {
	d := &c.direct
	if d.writing || d.torn {
		return // the Write in progress may be using any entry
	}
	for i := range d.entries {
		if e := &d.entries[i]; e.used <= d.atTick && !c.dropDirectLocked(e) {
			return
		}
	}
	d.atTick = d.clock
}

// dropDirectLocked deregisters e's buffer, if any, and stops referencing it. A
// deregistration that fails fails the Conn: it reports false.
func (c *Conn) dropDirectLocked(e *directMR) bool {
	if e.mr == nil {
		return true
	}
	err := e.mr.Close()
	*e = directMR{}
	if err != nil {
		c.taintPD() // pool.go: the PD may still hold it
		c.failLocked(fmt.Errorf("%w: deregister a written buffer: %w", ErrQPFailed, err))
		return false
	}
	return true
}

// releaseDirectLocked deregisters every cached buffer; the Conn stages from now on.
// Teardown calls it, once the QP is in ERROR, and wakes a Write waiting for its WRs.
func (c *Conn) releaseDirectLocked() error {
	d := &c.direct
	d.torn = true
	var first error
	for i := range d.entries {
		if e := &d.entries[i]; e.mr != nil {
			if err := e.mr.Close(); err != nil && first == nil {
				c.taintPD() // pool.go: the PD may still hold it
				first = fmt.Errorf("rdma: close: deregister a written buffer: %w", err)
			}
			*e = directMR{}
		}
	}
	signal(c.writable)
	return first
}

// writeDirect writes all of p from p itself, if p qualifies (see above), and reports
// whether it did; if not, the caller stages p. Called with wmu held.
func (c *Conn) writeDirect(p []byte) (n int, ok bool, err error) {
	least := c.direct.minLen
	if least == 0 {
		least = directMinWrite
	}
	if len(p) < least {
		return 0, false, nil
	}
	c.mu.Lock()
	mr, off := c.directRegion(p)
	c.mu.Unlock()
	if mr == nil {
		return 0, false, nil
	}
	n, err = c.postDirect(p, mr, off)
	if werr := c.awaitDirect(); err == nil {
		err = werr
	}
	return n, true, err
}

// postDirect posts p, registered in mr at offset off, chunk by chunk as credit and the
// send queue allow, until all of it is posted, the deadline passes, or the Conn fails
// or closes. It returns the bytes posted.
func (c *Conn) postDirect(p []byte, mr verbs.MR, off uint64) (int, error) {
	s := spin{c: c}
	defer s.end()
	var stall creditStall
	defer stall.end(c) // outside mu: the hook may call back into c
	n := 0
	for n < len(p) {
		if c.wdl.passed() {
			return n, os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		c.writeParked = false
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return n, err
		}
		if k := c.placeRoomLocked(); k > 0 { // place.go: into the peer's Read's buffer
			k = min(k, len(p)-n)
			err := c.postPlaceLocked(mr.Addr()+off+uint64(n), mr.LKey(), k)
			if err == nil {
				c.direct.until = c.sqPosted
				n += k
			}
			c.mu.Unlock()
			if err != nil {
				return n, err
			}
			continue
		}
		if room := c.directRoomLocked(); room > 0 {
			m, err := c.postDirectLocked(mr, off+uint64(n), min(len(p)-n, room))
			c.mu.Unlock()
			n += m
			if err != nil {
				return n, err
			}
			continue
		}
		if c.fc.Writable() == 0 {
			stall.noCredit()
		}
		if err := c.awaitRoomLocked(&s); err != nil {
			return n, err
		}
	}
	return n, nil
}

// directRoomLocked is how many bytes one direct post may carry now: what flow control
// allows, when the send queue has room for a reservation's two WRs.
func (c *Conn) directRoomLocked() int {
	if c.sqDepth-(c.sqPosted-c.sqDone) < 2 {
		return 0
	}
	return c.fc.Writable()
}

// postDirectLocked reserves up to n bytes and posts them, as one or two writes, from
// mr at offset off; the last is signaled, so that awaitDirect learns when they are
// done. They take no staging: completing them frees what was staged before them.
func (c *Conn) postDirectLocked(mr verbs.MR, off uint64, n int) (int, error) {
	res, err := c.fc.ReserveData(n)
	if err != nil {
		c.failLocked(protocolError(err))
		return 0, c.err
	}
	addr := mr.Addr() + off
	for i := range res.Count {
		m := res.Msgs[i]
		c.fillWR(i, m, addr, i == res.Count-1)
		c.sges[i][0].LKey = mr.LKey()
		addr += uint64(m.Len)
		c.wrEnd[i] = c.stageTail
	}
	if err := c.postLocked(res.Count); err != nil {
		return 0, err
	}
	c.direct.until = c.sqPosted
	c.stats.sent(res.Count, res.Bytes)
	return res.Bytes, nil
}

// awaitDirect waits until the device has completed every direct WR posted, the Conn
// has failed and its QP is in ERROR, or teardown released the QP. It returns the
// failure, if any. A failure during Close leaves the QP to teardown (failLocked): until
// then the device may still read the buffer (a provider's resend), so the Write waits
// for teardown, which follows.
func (c *Conn) awaitDirect() error {
	s := spin{c: c}
	defer s.end()
	for {
		c.mu.Lock()
		c.writeParked = false
		switch {
		case c.sqDone >= c.direct.until:
			c.direct.writing = false
			c.mu.Unlock()
			return nil
		case c.err != nil && c.qpErrored:
			err := c.err
			c.direct.writing = false
			c.mu.Unlock()
			return err
		case c.direct.torn:
			c.direct.writing = false
			c.mu.Unlock()
			return errClosedMidWrite
		}
		if s.more() {
			c.mu.Unlock()
			c.pollWaiting(s.polls)
			continue
		}
		c.writeParked = true
		parkChan(&c.writable)
		c.mu.Unlock()
		c.parking()
		<-c.writable // completions, failure and teardown all signal it
		c.unparked()
	}
}

var errClosedMidWrite = fmt.Errorf("rdma: write: closed before the device completed the write: %w", net.ErrClosed)
