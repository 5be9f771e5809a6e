package rdma

import "context"

// While a Read or Write spins on the CQ (conn_poll.go), the poller's goroutine steps
// aside: it neither spins nor arms the CQ, and waits until the last spinner stops. The
// spinner polls for everyone (pollFor), so a goroutine spinning beside it only takes
// a processor, and, as each of its runtime.Gosched calls wakes another thread to look
// for work, more than one: on a host whose cores are few, from the peer that fills the
// CQ (on verbs/shm, the other process, whose Reads and Writes spin the same way). And
// a goroutine that armed the CQ meanwhile would make the peer ring a doorbell for every
// completion (verbs/shm) although someone polls. Side by side, over shm between two
// processes on two cores, this took a 64-byte ping-pong's median round trip from 2.0-2.1
// times a Unix socket's to 1.3-1.4 times (see the commit).

// stepAside waits, when a waiter spins on the CQ, until the last one stops spinning
// (or ctx ends), and reports whether it waited.
func (p *poller) stepAside(ctx context.Context) bool {
	if p.spinners.Load() == 0 {
		return false
	}
	select {
	case <-p.spunOut:
	case <-ctx.Done():
	}
	return true
}

// unspin gives back a spinning slot; the last spinner out wakes the goroutine if it
// stepped aside. A wake-up that finds the goroutine elsewhere stays in spunOut and
// costs it one extra poll.
func (p *poller) unspin() {
	if p.spinners.Add(-1) == 0 {
		select {
		case p.spunOut <- struct{}{}:
		default:
		}
	}
}

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
