// Package cpuyield gives a polling thread's processor to the host's other threads
// (sched_yield), by a policy that backs off when the host is contended. It is for
// pollers that wait on something outside the Go scheduler's sight: another process
// (verbs/shm), a NIC or the kernel (verbs/ibv), which may need this very core.
//
// Such a poller should not yield with runtime.Gosched alone. With a processor idle,
// Gosched wakes another thread to look for goroutines to run, and that thread takes a
// core from whatever the poller waits for: between two processes on two cores, a
// 64-byte ping-pong over verbs/shm took 25 µs with it and 6 µs without. A thread
// yield gives the core up only to a thread that wants it, and returns at once when
// none does.
//
// How often depends on the host:
//
//   - With cores to spare, a yield returns at once (nothing else wants the core), and
//     every call yields.
//   - On a contended host, a yield hands the core to another task for up to its slice,
//     which the yielding poller pays on every poll. A yield that took longer than
//     SlowYield says so: for ContendedFor after it, only every ContendedEvery-th call
//     yields, and Contended reports true, so that pollers go back to runtime.Gosched,
//     which keeps their thread. Side by side on a loaded host, yielding at every poll
//     made the same ping-pong 100 µs, against 20 µs this way.
//
// The state is the process's ([Host]): contention is the host's, whichever poller
// meets it.
package cpuyield

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The policy's constants.
const (
	// SlowYield is the longest a yield takes on a host with cores to spare.
	SlowYield = 20 * time.Microsecond
	// ContendedFor is how long a slow yield makes the host count as contended.
	ContendedFor = 10 * time.Millisecond
	// ContendedEvery is how many calls yield once while the host is contended.
	ContendedEvery = 8
)

// Yielder holds the policy's state, with its clock and system call as seams.
type Yielder struct {
	now   func() time.Duration // a monotonic clock
	yield func()               // sched_yield

	busyUntil atomic.Int64 // now() until which the host is taken as contended
	calls     atomic.Uint32
}

var epoch = time.Now()

// Host is the process's yielder.
var Host = New(func() time.Duration { return time.Since(epoch) }, SchedYield)

// SchedYield gives the processor to another thread that wants it (sched_yield),
// whatever the policy: for a poller bounded in time rather than in polls.
func SchedYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// Now is the yielder's clock: monotonic, from an arbitrary start.
func (y *Yielder) Now() time.Duration { return y.now() }

// New returns a yielder on clock now (monotonic) whose yields call yield: for tests;
// everything else uses [Host].
func New(now func() time.Duration, yield func()) *Yielder {
	return &Yielder{now: now, yield: yield}
}

// Yield gives the processor to any other thread of the host that wants it, by the
// policy above.
func (y *Yielder) Yield() {
	start := y.now()
	if y.contendedAt(start) {
		if y.calls.Add(1)%ContendedEvery == 0 {
			y.yield()
		}
		return
	}
	y.yield()
	if end := y.now(); end-start > SlowYield {
		y.busyUntil.Store(int64(end + ContendedFor))
	}
}

// Contended reports whether a slow yield was seen less than ContendedFor ago: a
// poller should then yield with runtime.Gosched, which keeps its thread.
func (y *Yielder) Contended() bool { return y.contendedAt(y.now()) }

// contendedAt reports whether a slow yield was seen less than ContendedFor before t.
func (y *Yielder) contendedAt(t time.Duration) bool { return int64(t) < y.busyUntil.Load() }

// SetContended marks the host contended for ContendedFor from now, as a slow yield
// would, or not contended, as when that time has passed: for tests of pollers that
// follow Contended.
func (y *Yielder) SetContended(contended bool) {
	if contended {
		y.busyUntil.Store(int64(y.now() + ContendedFor))
		return
	}
	y.busyUntil.Store(0)
}
