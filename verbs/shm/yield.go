package shm

import "github.com/rsockio/rsock/internal/cpuyield"

// Yielding the processor. A poller of an empty ring or CQ waits for the peer process,
// which may need this very core to fill it, so it yields (sched_yield) between polls,
// by internal/cpuyield's policy: at every poll while the host has cores to spare, at
// every eighth while it is contended. The CQ tells pollers that spin on it whether its
// empty polls yield now (PollYields; rsock's engine): then they do not add
// runtime.Gosched, which with a processor idle wakes another thread to look for work,
// and that thread takes a core from the peer process (between two processes on two
// cores, a 64-byte ping-pong took 25 µs with it and 6 µs without); on a contended host
// they go back to runtime.Gosched, which keeps their thread.

// yieldCPU gives the processor to any other thread of the host that wants it, by the
// policy above.
func yieldCPU() { cpuyield.Host.Yield() }

// hostNow is the policy's clock, for waits bounded in time (spinPoll).
var hostNow = cpuyield.Host.Now

// PollYields reports whether an empty Poll yields the processor by itself now, so
// that a caller spinning on the CQ need not yield too: true unless the host is
// contended (see above). rsock's engine looks for it.
func (c *CQ) PollYields() bool { return !cpuyield.Host.Contended() }
