package shm

import "time"

// An empty Poll waits a moment for the peer. Between two processes that both poll,
// the record a Poll waits for comes within a microsecond or two of the peer's post,
// and what a Poll did when it found nothing was most of a small round trip: on a host
// whose other tasks want the cores (yield.go's "contended"), rsock's engine followed
// each empty poll with runtime.Gosched, which wakes another thread of the runtime to
// look for work (a futex wake-up, and a sleep when it finds none) that takes a core
// from the peer process; on a quiet host, each empty poll was a sched_yield system
// call. Over rsockperf's 64-byte ping-pong between two processes, that put the median
// round trip near 10 µs where the exchange itself takes about 1 µs.
//
// So an empty Poll drives the rings and looks at the CQ again, with no system call,
// for up to emptyPollWait before it returns empty (and yields, by yield.go's policy):
// a record that lands meanwhile is reaped at once, and a spinner's next empty poll,
// with its yield or Gosched, comes that much later. The wait is bounded, and so is the
// number of empty polls a spinner makes before it sleeps (rsock's PollSpin), so an
// idle connection still stops spinning: emptyPollWait only sets how long each of
// those polls lasts. emptyPollLooks bounds the looks too, for a clock that stands
// still (a synctest bubble).
const (
	emptyPollWait  = 2 * time.Microsecond
	emptyPollLooks = 1 << 12
)

// spinPoll calls poll until it reports that it found something, or until
// emptyPollWait has passed on the clock now since the first call, or emptyPollLooks
// calls; it reports whether poll found something.
func spinPoll(now func() time.Duration, poll func() bool) bool {
	if poll() {
		return true
	}
	start := now()
	for range emptyPollLooks - 1 {
		if poll() {
			return true
		}
		if now()-start >= emptyPollWait {
			return false
		}
	}
	return false
}
