package shm

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Yielding the processor. A poller of an empty ring or CQ waits for the peer process,
// which may need this very core to fill it, so it yields (sched_yield) between polls.
// How often depends on the host:
//
//   - With cores to spare, a yield returns at once (nothing else wants the core), and
//     every empty poll yields. The CQ then tells pollers that spin on it (PollYields;
//     rsock's engine) not to add runtime.Gosched, which with a processor idle wakes
//     another thread to look for work, and that thread takes a core from the peer
//     process: between two processes on two cores, a 64-byte ping-pong took 25 µs with
//     it and 6 µs without.
//   - On a contended host, a yield hands the core to another task for up to its slice,
//     which the yielding poller pays on every poll. A yield that took longer than
//     slowYield says so: for contendedFor after it, only every contendedEvery-th call
//     yields, and PollYields is false, so that spinners go back to runtime.Gosched
//     between polls, which keeps their thread. Side by side on a loaded host, yielding
//     at every poll made the same ping-pong 100 µs, against 20 µs this way.
//
// The state is the process's: contention is the host's, whichever CQ meets it.
const (
	slowYield      = 20 * time.Microsecond
	contendedFor   = 10 * time.Millisecond
	contendedEvery = 8
)

// yielder holds the yield policy's state, with its clock and system call as seams.
type yielder struct {
	now   func() time.Duration // a monotonic clock
	yield func()               // sched_yield

	busyUntil atomic.Int64 // now() until which the host is taken as contended
	calls     atomic.Uint32
}

var epoch = time.Now()

// host is the process's yielder.
var host = yielder{
	now:   func() time.Duration { return time.Since(epoch) },
	yield: func() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) },
}

// yieldCPU gives the processor to any other thread of the host that wants it, by the
// policy above.
func yieldCPU() { host.yieldCPU() }

func (y *yielder) yieldCPU() {
	start := y.now()
	if y.contendedAt(start) {
		if y.calls.Add(1)%contendedEvery == 0 {
			y.yield()
		}
		return
	}
	y.yield()
	if end := y.now(); end-start > slowYield {
		y.busyUntil.Store(int64(end + contendedFor))
	}
}

// contendedAt reports whether a slow yield was seen less than contendedFor before t.
func (y *yielder) contendedAt(t time.Duration) bool { return int64(t) < y.busyUntil.Load() }

// PollYields reports whether an empty Poll yields the processor by itself now, so
// that a caller spinning on the CQ need not yield too: true unless the host is
// contended (see above). rsock's engine looks for it.
func (c *CQ) PollYields() bool { return !host.contendedAt(host.now()) }
