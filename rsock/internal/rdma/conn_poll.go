package rdma

import "runtime"

// The latency path. A Read that finds nothing buffered, or a Write that finds no room,
// does not park at once waiting for the poller's goroutine to reap the completion it
// needs and hand it over through a channel (a goroutine hand-off per message, most of
// a small round trip's cost). It first polls the shared CQ itself, a bounded number of
// times (the poller's spin, Options.PollSpin; at most GOMAXPROCS waiters at once, see
// beginSpin), under the poller's ownership token: whatever it reaps it dispatches to
// whichever connection owns it, exactly as the goroutine would, so receive WQEs are
// re-posted and credits and send completions accounted as usual, and its own data is
// buffered by the time it looks again. Only then does it park. Between polls it
// yields as the CQ calls for (poller.pause): runtime.Gosched on a CQ this process's
// goroutines fill (soft), a thread yield every few polls on one a NIC fills (ibv),
// none on Soft-RoCE's.
// The goroutine remains for when nobody is waiting (WQEs must be re-posted and credit
// returned whether or not the application reads); while waiters spin it stands by,
// polling nothing, and the last of them to stop nudges it (poller.standBy, endSpin),
// or leaves that to the next waiter (nudge.go).
// So a waiter holds its slot only while it polls, never across anything that may
// block.
//
// A parked waiter says so (readParked, writeParked, under mu), and completions signal
// its channel only then: a spinning waiter finds the state itself, and a channel
// signal nobody takes is a wasted lock and, in the worst case, a spurious wake-up.

// awaitsAnswer reports whether a Read waits for an answer: this side has written since
// the last Read began, so that what it waits for is likely the peer's reply, a round
// trip away, rather than the next piece of a stream. It clears the mark. Only a CQ
// filled outside the process spins an answer longer (answerSpinPolls): on any other,
// nothing looks at the mark, and a Read neither reads nor clears it.
func (c *Conn) awaitsAnswer() bool {
	return c.poll != nil && c.poll.outside && c.wrote.Load() && c.wrote.Swap(false)
}

// markWrote notes a Write for awaitsAnswer, without writing the flag's cache line
// again while it is set.
func (c *Conn) markWrote() {
	if !c.wrote.Load() {
		c.wrote.Store(true)
	}
}

// spin is one waiting Read's or Write's spin: how many polls it has made and may make.
// The first wait of the call claims one of the poller's spinning slots (beginSpin);
// without one, the waiter parks at once. A wait known to be long (a placement of many
// bytes: place.go) spins scale times the polls.
type spin struct {
	c            *Conn
	polls, limit int
	begun        bool
	answer       bool // a Read's wait for an answer to this side's writes: see beginSpin
	scale        int  // the spin's polls in units of the poller's; 0 means 1

	// A Read's last look (unread) found nothing (idle), and the Conn's readChanges
	// before it (seen): see quiet.
	idle bool
	seen uint32
}

// foundNothing records that a Read's look found nothing to return; seen is the Conn's
// readChanges loaded before the look.
func (s *spin) foundNothing(seen uint32) { s.idle, s.seen = true, seen }

// quiet reports whether a spinning Read may poll again without looking first: its
// last look found nothing, and nothing that could change that (an arrival, a failure,
// Close: Conn.readChanges) has happened since. A look takes mu, which every completion
// dispatched to the Conn and the Conn's own Writes take too; a spinning Read that
// looked after every poll took it a few times per message for nothing. A Read about to
// park always looks, under mu, so no change is slept through.
func (s *spin) quiet() bool { return s.idle && s.c.readChanges.Load() == s.seen }

// more reports whether the waiter should poll once more (pollWaiting) rather than park,
// and counts that poll. The last poll gives the slot back: the waiter parks next.
func (s *spin) more() bool {
	if !s.begun {
		s.begun, s.limit = true, s.c.beginSpin(s.answer)*max(s.scale, 1)
	}
	if s.polls >= s.limit {
		return false
	}
	s.polls++
	if s.polls == s.limit {
		s.c.poll.endSpin()
	}
	return true
}

// parking reports whether the waiter has spun out: if it finds nothing now, it parks.
func (s *spin) parking() bool { return s.begun && s.polls >= s.limit }

// end gives back the slot if the waiter still holds one; a later wait of the same
// call starts afresh.
func (s *spin) end() {
	if s.begun && s.polls < s.limit {
		s.c.poll.endSpin()
	}
	*s = spin{c: s.c, answer: s.answer, scale: s.scale}
}

// beginSpin is how many polls a waiter may make before it parks: the poller's spin
// while fewer waiters than the poller's maxSpinners (the processors) spin on its CQ,
// else none. More spinners could only take the processors from the goroutines that
// produce what they wait for (a server with many connections has many waiting Reads);
// the waiters beyond them park and are woken as before. A non-zero result holds a
// slot, which spin gives back. A Read's wait for an answer, on a CQ filled outside the
// process, spins longer (answerSpinPolls).
func (c *Conn) beginSpin(answer bool) int {
	p := c.poll
	if p == nil || p.spin == 0 || p.spinFutile() {
		return 0
	}
	spinningWaiters.Add(1) // endSpin uncounts it, whatever happens next
	if p.spinners.Add(1) > p.maxSpinners {
		p.endSpin()
		return 0
	}
	p.takeOver() // nudge.go
	if answer {
		return p.answerSpinPolls()
	}
	return p.spin
}

// heldTokenYieldEvery spaces a waiter's yields to whoever holds the poller's token:
// see pollWaiting.
const heldTokenYieldEvery = 4

// pollWaiting is one poll of a waiting Read or Write (see above), its polls-th. When
// it reaps nothing, because the CQ was empty or someone else holds the token, it
// yields the processor: on a loaded machine the peer, or whoever polls, may need it.
// An empty CQ is the poller's pause (poller_yield.go), which depends on what fills it.
// Someone else's token is held by a goroutine of this process, which runtime.Gosched
// lets run; but it is usually another waiter, running on another processor and about
// to let go, and dispatching this waiter's completion as it does. So the waiter yields
// to it only every heldTokenYieldEvery-th time it finds the token taken, and looks
// again at once otherwise. On soft, a writer waiting for its own send completion while
// the reader's spin held the token lost a Gosched to it on most placements: yielding
// every time, a placed 64 KiB stream ran at 28.9–32.2 GB/s and a 64-byte round trip
// took 1074–1091 ns; yielding every fourth time, 33.5–34.9 GB/s and 1029–1070 ns (three
// alternations of the same test binary built both ways).
func (c *Conn) pollWaiting(polls int) {
	if c.poll == nil {
		runtime.Gosched()
		return
	}
	switch n := c.poll.pollFor(c.qp.QPN(), c); {
	case n < 0 && polls%heldTokenYieldEvery != 0:
	case n < 0:
		c.poll.spinYielder().Gosched()
	case n == 0:
		c.poll.pause(polls)
	}
}
