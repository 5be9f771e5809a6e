package rdma

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
