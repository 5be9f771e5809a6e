package rdma

import (
	"runtime"

	"github.com/rsockio/rsock/internal/cpuyield"
)

// pollYielder is implemented by a CQ whose empty polls may yield the processor
// themselves, as verbs/shm's do while its host has cores to spare; PollYields says
// whether they do now. A spinner on such a CQ, waiter or goroutine, then skips
// runtime.Gosched: with a processor idle, each Gosched wakes another thread to look
// for work, which takes a core from the peer process the spinner waits for, and the
// CQ's own yield already gives the core up. Over shm between two processes on two
// cores with cores to spare, this took a 64-byte ping-pong's median round trip from
// 25 µs to 6 µs (see the commit).
type pollYielder interface{ PollYields() bool }

// cqYielder returns cq's pollYielder, or nil.
func cqYielder(cq completionQueue) pollYielder {
	y, _ := cq.(pollYielder)
	return y
}

// yields reports whether an empty poll of the CQ yielded the processor by itself.
func (p *poller) yields() bool { return p.yielder != nil && p.yielder.PollYields() }

// outsideFiller is implemented by a CQ that something outside the Go scheduler's
// sight fills: a NIC, or the kernel (verbs/ibv's, whose FilledOutside is true). A
// spinner that waits on such a CQ waits for a core the runtime does not manage (the
// kernel's Soft-RoCE, a peer process on the same host), so it does not yield with
// runtime.Gosched after every empty poll, which with a processor idle wakes another
// thread to look for goroutines and takes that core (see internal/cpuyield). Soft's
// CQs are filled by this process's goroutines, which Gosched lets run.
type outsideFiller interface{ FilledOutside() bool }

// filledOutside reports whether cq says it is filled outside the process.
func filledOutside(cq completionQueue) bool {
	f, ok := cq.(outsideFiller)
	return ok && f.FilledOutside()
}

// How a spinner on a CQ filled outside spaces its yields (pause): of
// outsideYieldEvery empty polls, one yields the thread (cpuyield's policy: a
// sched_yield, or runtime.Gosched on a contended host), the others look again at
// once; of outsideGoschedEvery, one is a runtime.Gosched, so that goroutines that
// share the spinner's processor still run while it spins.
const (
	outsideYieldEvery   = 8
	outsideGoschedEvery = 64
)

// readSpinPolls is how many empty polls a waiting Read makes before it parks: the
// poller's spin, which counts yields, in polls. On a CQ filled outside, a Read's spin
// lasts as many yields, outsideYieldEvery polls each: it waits for its peer's answer,
// and one that comes after the spin costs a sleep on the completion channel and a
// wake-up. Writes waiting for room, and the poller's goroutine, spin the poller's spin
// in polls: they wait for a reader or for nobody, and the cores they would spin on are
// the ones the kernel's Soft-RoCE and the peer move the stream with. On Soft-RoCE in
// the CI's VM (2 vCPUs, rsockperf between two processes, perf-only boots; the build
// before, four boots: a default-mode 64-byte round trip of 500–675 µs, streams of
// 40.8–46.5 MB/s with 64 KiB writes and 27.6–33.3 MB/s with 4 KiB ones):
//
//   - every spin in yields (two boots): the round trip at 142–143 µs, and the streams
//     at 35.0–36.5 and 22.5–24.2 MB/s;
//   - every spin in polls (two boots): the round trip at 970–1040 µs, as the spin
//     ended 8 times sooner, and the streams at 44.6–51.3 and 32.9–35.0 MB/s;
//   - a Read's spin in yields and the rest in polls (this; two boots): the round trip
//     at 162–175 µs, and the streams at 41.6–42.7 and 27.7–30.5 MB/s, within the
//     spread of the build before.
func (p *poller) readSpinPolls() int {
	if p.outside {
		return p.spin * outsideYieldEvery
	}
	return p.spin
}

// pause is a spinner's wait between an empty poll and the next; polls counts the
// spinner's polls so far, from one, this one included.
func (p *poller) pause(polls int) {
	y := p.sched
	if y == nil {
		y = hostYield{}
	}
	switch {
	case p.yields(): // the poll yielded already
	case !p.outside || polls%outsideGoschedEvery == 0:
		y.Gosched()
	case polls%outsideYieldEvery != 0:
	case y.Contended():
		y.Gosched()
	default:
		y.Yield()
	}
}

// threadYielder is how pause yields: the runtime's and internal/cpuyield's, or a test's.
type threadYielder interface {
	Gosched()        // runtime.Gosched
	Yield()          // cpuyield's policy
	Contended() bool // cpuyield's host is contended
}

type hostYield struct{}

func (hostYield) Gosched()        { runtime.Gosched() }
func (hostYield) Yield()          { cpuyield.Host.Yield() }
func (hostYield) Contended() bool { return cpuyield.Host.Contended() }
