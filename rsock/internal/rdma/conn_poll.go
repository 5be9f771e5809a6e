package rdma

import "runtime"

// The latency path. A Read that finds nothing buffered, or a Write that finds no room,
// does not park at once waiting for the poller's goroutine to reap the completion it
// needs and hand it over through a channel (a goroutine hand-off per message, most of
// a small round trip's cost). It first polls the shared CQ itself, a bounded number of
// times (the poller's spin, Options.PollSpin), under the poller's ownership token:
// whatever it reaps it dispatches to whichever connection owns it, exactly as the
// goroutine would, so receive WQEs are re-posted and credits and send completions
// accounted as usual, and its own data is buffered by the time it looks again. Only
// then does it park. The goroutine remains for when nobody is waiting (WQEs must be
// re-posted and credit returned whether or not the application reads).
//
// A parked waiter says so (readParked, writeParked, under mu), and completions signal
// its channel only then: a spinning waiter finds the state itself, and a channel
// signal nobody takes is a wasted lock and, in the worst case, a spurious wake-up.

// waitSpins is how many times a waiting Read or Write polls before it parks: the
// poller's spin, or none without a poller (a Conn of the fake tests).
func (c *Conn) waitSpins() int {
	if c.poll == nil {
		return 0
	}
	return c.poll.spin
}

// pollWaiting is one poll of a waiting Read or Write (see above). When it reaps
// nothing, because the CQ was empty or someone else holds the token, it yields the
// processor: on a loaded machine the peer, or whoever polls, may need it.
func (c *Conn) pollWaiting() {
	if c.poll == nil || c.poll.pollFor(c.qp.QPN(), c) <= 0 {
		runtime.Gosched()
	}
}
