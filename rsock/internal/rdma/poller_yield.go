package rdma

import (
	"runtime"
	"sync/atomic"
	"time"

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

// pollDriver is implemented by a CQ whose polls may themselves make the completions the
// poller waits for, by draining the queues that feed it: verbs/shm's, while few enough
// QPs feed it (PollDrives says whether they do now). When they do not, its completions
// are made by goroutines of this process that the network poller wakes (shm's, on a
// peer's doorbell), and neither a waiter nor the poller's goroutine spins on it
// (spinFutile): a spinner keeps its processor busy, runtime.Gosched included, and Go's
// scheduler consults the network poller only when it finds no goroutine to run, or from
// sysmon every 10 ms. With 64 connections within one process over shm, 127 QPs on one
// CQ when shm's Polls drove 64 at most, a 2-byte round trip on each at once took mostly
// 8–16 ms: 10.1 thousand round trips a second, and 12.8 thousand without these spins
// (medians of five, 2026-12-01); TCP made 92–100 thousand.
//
// An engine's own CQs hold at most 224 QPs (16,384 entries, SendWQEs+RecvWQEs+1 a QP),
// under shm's 256: this is a safeguard for CQs sized otherwise.
type pollDriver interface{ PollDrives() bool }

// cqDriver returns cq's pollDriver, or nil.
func cqDriver(cq completionQueue) pollDriver {
	d, _ := cq.(pollDriver)
	return d
}

// spinFutile reports whether spinning on the CQ is futile now (see pollDriver).
func (p *poller) spinFutile() bool { return p.driver != nil && !p.driver.PollDrives() }

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

// hostFiller is implemented by a CQ that says whether what fills it runs on this
// host's cores: verbs/ibv's FilledOnHost, true on the kernel's Soft-RoCE, whose
// completions are made by the kernel's packet processing on this host, not by a NIC.
type hostFiller interface{ FilledOnHost() bool }

// filledOnHost reports whether cq says it is filled by this host's cores.
func filledOnHost(cq completionQueue) bool {
	f, ok := cq.(hostFiller)
	return ok && f.FilledOnHost()
}

// How a spinner on a CQ filled outside spaces its yields (pause): of
// outsideGoschedEvery empty polls, one is a runtime.Gosched, so that goroutines that
// share the spinner's processor still run while it spins; of outsideYieldEvery, one
// yields the thread (a sched_yield; by cpuyield's policy runtime.Gosched on a
// contended host), unless the CQ is filled by this host's cores, where no poll does;
// the others look again at once.
const (
	outsideYieldEvery   = 8
	outsideGoschedEvery = 64
)

// answerSpinPolls is how many empty polls a Read that waits for an answer (to this
// side's writes: awaitsAnswer) makes before it parks: the poller's spin, which counts
// yields, in polls. On a CQ filled outside, its spin lasts as many yields,
// outsideYieldEvery polls each (on Soft-RoCE, whose spinners do not yield,
// onHostAnswerScale times as many polls): an answer that comes after the spin costs a
// sleep on the completion channel and a wake-up. Other waits spin the poller's spin in
// polls: a Read of a stream, which waits for the next piece, a Write for room, and the
// poller's goroutine, for nobody; the cores they would spin on are the ones the
// kernel's Soft-RoCE and the peer move the stream with. On Soft-RoCE in the CI's VM (2
// vCPUs, rsockperf between two processes, perf-only boots; the build before, four
// boots: a default-mode 64-byte round trip of 500–675 µs, streams of 40.8–46.5 MB/s
// with 64 KiB writes and 27.6–33.3 MB/s with 4 KiB ones):
//
//   - every spin in yields (two boots): the round trip at 142–143 µs, and the streams
//     at 35.0–36.5 and 22.5–24.2 MB/s;
//   - every spin in polls (two boots): the round trip at 970–1040 µs, as the spin
//     ended 8 times sooner, and the streams at 44.6–51.3 and 32.9–35.0 MB/s;
//   - every Read's spin in yields, the rest in polls (two such boots and two of CI's,
//     which run the tests too): the round trip at 158–212 µs, and the streams at
//     41.6–42.8 and 27.7–30.5 MB/s, the 4 KiB one below rstream's in all four;
//   - only an answer's in yields, the rest in polls (this; two boots): the round trip
//     at 214–234 µs, and the streams at 38.6–41.6 and 30.3–30.7 MB/s, the 4 KiB one
//     1.02× rstream's in both.
func (p *poller) answerSpinPolls() int {
	switch {
	case p.onHost:
		return p.spin * outsideYieldEvery * onHostAnswerScale
	case p.outside:
		return p.spin * outsideYieldEvery
	}
	return p.spin
}

// onHostAnswerScale lengthens, on a CQ filled by this host's cores, the spin of a Read
// that waits for an answer: its polls do not yield (pause), so each takes a fraction of
// the time a poll and its share of a yield took, and a spin of the same count ended
// before the answer came. The Read then parked, and in the CI's VM a parked Read's
// wake-up cost the round trip milliseconds: the default mode's 64 B round trip took
// 4.3–6.1 ms (5.55× ibv_rc_pingpong -e's) in CI's boot of the polls without this,
// against 0.6 ms before them.
const onHostAnswerScale = 8

// pause is a spinner's wait between an empty poll and the next; polls counts the
// spinner's polls so far, from one, this one included.
//
// A due thread yield follows cpuyield's policy, which on a host that looks contended
// (a yield took long: someone else ran) yields with runtime.Gosched instead, keeping
// the core. Toward a NIC that is right: nothing this host runs makes the completion.
//
// On a CQ filled by this host's cores (onHost: Soft-RoCE), the spinner never yields its
// thread: it polls, with a runtime.Gosched every outsideGoschedEvery polls and nothing
// between. What makes its completion is the kernel's packet processing, in softirq
// context or a kworker that the kernel wakes when there is work; a sched_yield every
// eighth poll cost the spinner a system call each time and, whenever another thread of
// the host was runnable, its core for that thread's slice. In the CI's VM, one binary
// with the two policies as variants, interleaved over five rounds (quiet host,
// 2026-11-29), the 64 B round trip took 342–833 µs spinning and 361–609 µs in the
// default mode without the yields, against 561–974 µs and 592–1010 µs with them (0.73×
// and 1.38× rstream's, medians), and lost in none of the rounds; streams of 4 KiB and
// 64 KiB stayed within the rounds' spread (benchmarks/README.md). CI's boot of it then
// showed the default mode's answer spin too short (onHostAnswerScale). An earlier boot
// had measured fewer yields slower (one every 32nd or 128th poll: 2.2 and 2.8 ms
// against 1.45 ms), before the last spinner's nudge of the poller's goroutine was
// deferred (nudge.go). With a busy loop on one of the host's two cores (two boots, in
// which every tool's round trip swung from 0.8 to 3.8 ms round to round), the spinning
// round trip was slower without the yields (medians 2.43 and 3.57 ms against 1.71 and
// 2.70), the default one was not, and the streams went either way.
func (p *poller) pause(polls int) {
	y := p.spinYielder()
	switch {
	case p.yields(): // the poll yielded its thread already
		if p.everyProcessorSpins() {
			// but not the processor to this process's other goroutines
			y.Gosched()
		}
	case !p.outside || polls%outsideGoschedEvery == 0:
		y.Gosched()
	case p.onHost: // polls on: see above
	case polls%outsideYieldEvery != 0:
	case y.Contended():
		y.Gosched()
	default:
		y.Yield()
	}
}

// everyProcessorSpins reports whether spinners may hold every processor of the
// process: with GOMAXPROCS at 1, or as many waiters spinning as there are processors.
// A spinner on a CQ whose empty polls yield the thread (verbs/shm's) then yields the
// processor too, with runtime.Gosched, as on soft. Without it, the goroutines it holds
// the processor from waited out its spin, hundreds of polls: the peer's end of a
// same-host connection in this process, which makes the very answer the spinner waits
// for, or the rest of a server (grpc-go's writer and handlers). In a process with one
// processor (a container limited to one CPU: GOMAXPROCS follows the limit), net/http
// over shared memory within the process ran at 0.39× a Unix socket's requests/s and
// gRPC at 0.62×, where at two processors they ran at 1.15× and 1.04×; between two such
// processes, gRPC at 0.71× TCP's calls/s (benchmarks/README.md, 2026-11-30). The cost
// that keeps Gosched out of such a spin otherwise, a thread woken for an idle
// processor that takes the core from the peer process, cannot arise: no processor is
// idle. Spinners are counted over every poller of the process (spinningWaiters), and
// the processors read again now and then (processors): Go changes GOMAXPROCS when a
// container's CPU limit changes.
func (p *poller) everyProcessorSpins() bool {
	n := processors()
	return n <= 1 || spinningWaiters.Load() >= n
}

// spinningWaiters counts the waiters spinning on every poller of the process
// (beginSpin, endSpin).
var spinningWaiters atomic.Int32

// processors returns GOMAXPROCS as read at most procsMaxAge ago: reading it takes the
// scheduler's lock, too often for every empty poll. A variable, for tests.
var processors = func() int32 {
	now := int64(time.Since(procsEpoch))
	if n := procsCached.Load(); n > 0 && now-procsReadAt.Load() < int64(procsMaxAge) {
		return n
	}
	n := int32(runtime.GOMAXPROCS(0))
	procsCached.Store(n)
	procsReadAt.Store(now)
	return n
}

const procsMaxAge = time.Second

var (
	procsEpoch  = time.Now()
	procsCached atomic.Int32
	procsReadAt atomic.Int64
)

// spinYielder is how the poller's spinners yield: sched, or the runtime's and cpuyield's.
func (p *poller) spinYielder() threadYielder {
	if p.sched == nil {
		return hostYield{}
	}
	return p.sched
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
