package rdma

import "time"

// Handing the CQ back to the poller's goroutine. While waiters spin on the CQ, the
// goroutine stands by (poller.standBy) and the waiters' polls reap for everyone; once
// the last of them leaves, somebody must poll again, and the goroutine is woken for it
// (a nudge). Woken at once, it was woken for nearly every message of a connection that
// answers as it reads: its Read spins, finds the answer and leaves, and the next Read
// spins again soon after, once the goroutine had been made runnable, had taken a
// processor (with one idle, a thread woken for it), polled and stood by again. On
// Soft-RoCE in the CI's VM, where every thread woken takes a vCPU from the kernel that
// makes the completions, the spinning 64-byte round trip took 1.17-1.21 ms that way
// and 0.68-0.70 ms with no nudge at all (benchmarks/README.md, 2026-11-29).
//
// So the last spinner to leave defers the nudge: the poller owes it (owed), and it is
// paid by whichever comes first:
//
//   - a new spinner, which takes the polling over (takeOver) and so owes nothing;
//   - a waiter that parks on what the poller's dispatch signals (parking), since
//     nobody polls for it otherwise; a leaving spinner that finds one parked already
//     nudges at once;
//   - late, a timer, once a deferral is nudgeGrace old and nobody took it over, for
//     the completions nobody waits for: receive WQEs to re-post, credit and sends to
//     account, keepalive probes, a FIN to see.
//
// late is not reset by every deferral: resetting a timer to fire sooner than the
// others wakes the thread that sleeps until the next timer, the very wake-up deferral
// saves (5 ms timers reset per message measured 0.77-1.17 ms). It is armed by a
// deferral when it is not running, and when it fires it looks: a deferral still owed
// and made since it was armed gets another nudgeGrace, one older is paid, and with
// nothing owed it stops. So a deferral is paid within two nudgeGraces, and busy
// spinners cost one timer per nudgeGrace.
//
// The leaving spinner stores owed before it looks at parked, and a parking waiter
// counts itself in parked before it looks at owed, so one of them sees the other (Go's
// atomics are sequentially consistent). A parked count left behind only makes every
// nudge immediate, as before; a park that is not counted waits two nudgeGraces at most.

// nudgeGrace is how long a deferred nudge waits at least for a spinner or a parking
// waiter before the goroutine is woken, and half the most it waits: far longer than
// an application takes between one Read's return and its next wait, short next to
// what waits on completions nobody waits for (a keepalive period, a peer's writer out
// of receive WQEs because this side does not read). Every wait that depends on the
// dispatch spins or parks, so nothing an application waits for waits on late.
//
// Each time late fires, and each time a deferral arms it anew, the runtime wakes a
// thread (late's function runs in a goroutine of its own; a timer that becomes the
// earliest wakes the netpoller's). Runtime traces of a spinning 64 B ping-pong on
// Soft-RoCE in the CI's VM counted 420-480 idle processors started per second; with
// late at 10 ms, 72-78 of them ran its goroutine and 151-165 found nothing to run
// (21 and 30 at 100 ms, in a build that also dropped the spinners' Gosched). At 100
// ms, in one boot of six interleaved rounds, the round trip's p50 went from 0.81-1.06
// ms (median 0.96) to 0.79-1.03 ms (0.90), p99 unchanged (benchmarks/README.md,
// 2026-11-29).
const nudgeGrace = 100 * time.Millisecond

// initNudge makes the poller's nudge channel and its late timer, stopped.
func (p *poller) initNudge() {
	p.nudge = make(chan struct{}, 1)
	p.late = time.AfterFunc(time.Hour, p.lateNudge)
	p.late.Stop()
}

// endSpin gives back a spinning slot. The last spinner to leave while the goroutine
// stands by (see run) hands it the CQ back: at once if a waiter is parked, else
// deferred (see above). A waiter must give its slot back before anything that may
// block (a Read of the reader ReadFrom copies from, say): until a deferred nudge is
// paid, nobody polls.
func (p *poller) endSpin() {
	spinningWaiters.Add(-1)
	if p.spinners.Add(-1) != 0 || !p.standby.Load() {
		return
	}
	p.owed.Store(true)
	if p.parked.Load() > 0 {
		p.payNudge()
		return
	}
	p.deferrals.Add(1)
	p.armLate()
}

// takeOver is a new spinner's: its polls serve everyone, so a nudge owed is not.
func (p *poller) takeOver() {
	if p.owed.Load() {
		p.owed.Store(false)
	}
}

// parking counts a waiter about to park on something the poller's dispatch signals,
// and pays a nudge owed: nobody else may poll for it. unparked uncounts it.
func (p *poller) parking() {
	p.parked.Add(1)
	if p.owed.Load() {
		p.payNudge()
	}
}

func (p *poller) unparked() { p.parked.Add(-1) }

// armLate starts late unless it runs, marking the deferrals made so far.
func (p *poller) armLate() {
	if !p.lateArmed.Load() && p.lateArmed.CompareAndSwap(false, true) {
		p.lateMark.Store(p.deferrals.Load())
		p.late.Reset(nudgeGrace)
	}
}

// lateNudge is late's: see above.
func (p *poller) lateNudge() {
	if p.owed.Load() {
		if n := p.deferrals.Load(); n != p.lateMark.Load() {
			p.lateMark.Store(n) // deferred again since: that one's grace
			p.late.Reset(nudgeGrace)
			return
		}
		if p.spinners.Load() == 0 {
			p.payNudge()
		}
	}
	p.lateArmed.Store(false)
	if p.owed.Load() { // deferred while late was stopping
		p.armLate()
	}
}

// payNudge wakes the goroutine if a nudge is owed, once.
func (p *poller) payNudge() {
	if !p.owed.Swap(false) {
		return
	}
	select {
	case p.nudge <- struct{}{}:
	default: // a nudge is pending already
	}
}

// stopNudge forgets a nudge owed and stops late: the goroutine has stopped.
func (p *poller) stopNudge() {
	p.owed.Store(false)
	if p.late.Stop() {
		p.lateArmed.Store(false)
	}
}

// parking counts a waiter of c about to park (see poller.parking); c may have no
// poller (tests).
func (c *Conn) parking() {
	if c.poll != nil {
		c.poll.parking()
	}
}

// unparked uncounts a waiter that parking counted.
func (c *Conn) unparked() {
	if c.poll != nil {
		c.poll.unparked()
	}
}
