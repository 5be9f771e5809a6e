package rdma

import (
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a settable point in time that pending waits observe: its channel is
// closed when the time passes, and replaced when the deadline moves into the future.
//
// The channel is made when a deadline is first set: until then wait returns nil, a
// channel that never fires, so that a connection whose deadlines are never set makes
// none. The channel is held in an atomic.Value rather than behind an atomic.Pointer: a
// channel is pointer-shaped, so storing one boxes nothing.
//
// The timer that closes the channel is armed only when a wait parks (parkOn). Most
// Reads and Writes under a deadline never park: the deadline is set, the bytes are
// there or go at once, and it is cleared or moved for the next request. Arming a timer
// for each of them is what made SetReadDeadline cost a connection's server 6–7 µs
// of its setup on the development machine (time.AfterFunc's timer and the runtime's
// wake-up of a thread for it), against under 1 µs for a TCP socket's. A wait that does
// not park learns that the deadline passed from passed, which reads the clock while a
// deadline is set and no timer is armed for it. set reports when waits may be parked,
// so that its caller wakes them to arm for the deadline it set (Conn.setDeadlines).
//
// One timer serves every deadline the Conn is given, made with the first arming and
// reset by the next: a server that moves its deadlines with each request (net/http's
// timeouts) allocates nothing for them after the first. A timer stopped or reset may
// still fire once for the time it was set to before (time.AfterFunc's Reset does not
// wait for a callback already under way), so fire acts only on an armed deadline in
// force: it closes the channel once that has passed, and waits again for what is left
// of one still ahead.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer // fire; nil until a wait first armed a deadline
	at    time.Time   // the deadline in force, on the monotonic clock; zero: none
	armed bool        // timer is set for at

	// due is at, as nanoseconds after epoch plus one, while at is in force, ahead and
	// unarmed; 0 otherwise. It lets passed and parkOn see, with one atomic load, that
	// there is nothing to do, and passed compare it with the clock without mu.
	due atomic.Int64
	// epoch is set by the first set of a deadline, before due is first stored, and
	// never changes: passed reads it after loading a due that is not 0.
	epoch time.Time

	expired atomic.Value // chan struct{}, once set made one
	// fired is set, under mu, when the channel in force is closed, and cleared when
	// renew replaces it: passed, which a spinning Read or Write calls on every look,
	// reads it with one atomic load rather than a non-blocking receive on the channel
	// (3% of a 64-byte round trip's CPU on soft, once a deadline had been set).
	fired atomic.Bool
}

// renew installs a fresh, open channel. Called with mu held (or before use).
func (d *deadline) renew() chan struct{} {
	ch := make(chan struct{})
	d.expired.Store(ch)
	d.fired.Store(false)
	return ch
}

// fireLocked closes the channel in force, ch, which is open. Called with mu held.
func (d *deadline) fireLocked(ch chan struct{}) {
	close(ch)
	d.fired.Store(true)
}

// set moves the deadline to t; the zero time means none. It reports whether waits
// that may be parked must be woken: ones that began on no deadline, to wait on the
// channel set made, and ones parked on this channel, to arm the timer for the deadline
// set recorded (parkOn). Like package net's, a deadline is taken as a duration from
// now: a wall clock that jumps later does not move it.
func (d *deadline) set(t time.Time) (wake bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed {
		d.timer.Stop() // a callback under way finds the deadline unarmed (fire)
		d.armed = false
	}
	d.at = time.Time{}
	d.due.Store(0)
	ch := d.wait()
	closed := d.fired.Load()
	if t.IsZero() {
		if closed {
			d.renew()
		}
		return false
	}
	made := ch == nil
	if made {
		ch = d.renew()
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.renew()
		}
		now := time.Now()
		if d.epoch.IsZero() {
			d.epoch = now
		}
		d.at = now.Add(dur)
		d.due.Store(int64(d.at.Sub(d.epoch)) + 1) // on the monotonic clock
		return true
	}
	if !closed {
		d.fireLocked(ch)
	}
	return made
}

// passed reports whether the deadline in force has passed, closing its channel if no
// timer did. A wait calls it each time it looks for its bytes or room.
func (d *deadline) passed() bool {
	if d.fired.Load() {
		return true
	}
	due := d.due.Load()
	return due != 0 && int64(time.Since(d.epoch)) >= due-1 && d.expire()
}

// expire closes the channel if the deadline in force has passed, and reports whether
// it is closed.
func (d *deadline) expire() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := d.wait()
	if ch == nil || d.fired.Load() {
		return ch != nil
	}
	if d.at.IsZero() || time.Now().Before(d.at) {
		return false
	}
	d.due.Store(0)
	d.fireLocked(ch)
	return true
}

// parkOn returns the channel a wait that parks selects on, with the timer armed to
// close it when the deadline in force passes.
func (d *deadline) parkOn() chan struct{} {
	if d.due.Load() != 0 {
		d.arm()
	}
	return d.wait()
}

// arm sets the timer for the deadline in force, unless one is set already, or closes
// the channel if the deadline has passed.
func (d *deadline) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.due.Load() == 0 { // armed, cleared or passed meanwhile
		return
	}
	d.due.Store(0)
	left := time.Until(d.at)
	if left <= 0 {
		if !d.fired.Load() {
			d.fireLocked(d.wait())
		}
		return
	}
	d.armed = true
	if d.timer == nil {
		d.timer = time.AfterFunc(left, d.fire)
	} else {
		d.timer.Reset(left)
	}
}

// fire is the timer's callback: it closes the channel if the armed deadline in force
// has passed. A deadline moved or cleared since (set disarms) leaves nothing to do; one
// armed again for later is waited for again.
func (d *deadline) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.armed || d.at.IsZero() {
		return
	}
	if left := time.Until(d.at); left > 0 {
		d.timer.Reset(left)
		return
	}
	if ch := d.wait(); ch != nil && !d.fired.Load() {
		d.fireLocked(ch)
	}
}

// wait returns a channel closed when the deadline passes, or nil (never ready) while no
// deadline was ever set. The channel is closed in time only for a wait that parked on
// it (parkOn); one that does not park asks passed.
func (d *deadline) wait() chan struct{} {
	ch, _ := d.expired.Load().(chan struct{})
	return ch
}
