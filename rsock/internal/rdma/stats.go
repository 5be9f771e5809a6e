package rdma

import (
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// Stats is a snapshot of a Conn's counters and buffer occupancy (see [Conn.Stats]).
// Counters only grow; occupancies are as of the snapshot.
type Stats struct {
	// MessagesSent and BytesSent count the data messages (RDMA writes with immediate
	// that carry bytes; a write that wraps around the peer's ring is two) this side
	// posted, and their payload. MessagesReceived and BytesReceived count those that
	// arrived from the peer. Control messages (credit updates, keepalives, FIN,
	// resizes) are not counted.
	MessagesSent, MessagesReceived uint64
	BytesSent, BytesReceived       uint64
	// Placements counts the Reads whose buffer the peer's device wrote into (direct
	// placement, place.go), and BytesPlaced those bytes: part of MessagesReceived and
	// BytesReceived, and the bytes no Read copied out of the ring.
	Placements, BytesPlaced uint64
	// CreditStalls counts the times a writer blocked because the peer had granted no
	// ring or receive-WQE credit, and CreditStallTime is how long those waits lasted
	// in all. A writer waiting for its own staging buffer or send queue is not stalled
	// on credit and is not counted.
	CreditStalls    uint64
	CreditStallTime time.Duration
	// CompletionErrors counts work completions that failed (the first failure moves
	// the QP to ERROR, and the work requests still outstanding then flush, each a
	// failed completion too); RNRErrors counts those that failed because the peer had
	// no receive WQE posted after every retry (IBV_WC_RNR_RETRY_EXC_ERR).
	CompletionErrors, RNRErrors uint64
	// RingSize is the receive ring's current size and RingUsed the bytes in it that
	// the application has not read yet; Spilled is the bytes moved out of the ring
	// into unpinned memory and not read yet (see "Buffering" in the package docs).
	RingSize, RingUsed, Spilled int
	// RecvWQEs is how many receive WQEs the Conn keeps posted now: Options.RecvWQEs,
	// plus those a stream of small messages made it add ("Receive queues that grow").
	RecvWQEs int
	// StagingSize is the send staging buffer's current size, StagingUsed the bytes of
	// it posted and not yet acknowledged by a completion.
	StagingSize, StagingUsed int
}

// Hooks are called by a Conn on events a tracer wants to see. Each may be nil. They
// must not block: CreditStall runs on the writer's goroutine as the stall ends, Failed
// on a goroutine of its own.
type Hooks struct {
	// CreditStall reports a writer's wait for credit that just ended, and its length.
	CreditStall func(waited time.Duration)
	// Failed reports the Conn's first failure (a failed completion, a lost control
	// channel, a protocol violation), as Read and Write will return it.
	Failed func(err error)
}

// connStats holds a Conn's counters. Messages and bytes are counted where the Conn's
// mutex is held anyway (posting, arrivals), so they are plain integers that Stats reads
// under it; stalls and errors, counted outside it and rare, are atomics. No count
// allocates, and the hot paths pay one add per counter.
type connStats struct {
	msgsSent, msgsRecv   uint64 // guarded by Conn.mu
	bytesSent, bytesRecv uint64 // guarded by Conn.mu
	placed, bytesPlaced  uint64 // guarded by Conn.mu
	stalls               atomic.Uint64
	stallNanos           atomic.Int64
	wcErrors, rnrErrors  atomic.Uint64
	hooks                atomic.Pointer[Hooks]
}

// StatsOff turns the counting off in every Conn of the process. It exists for the
// benchmarks that measure what counting costs (rsock's BenchmarkStatsCost); nothing
// else sets it.
var StatsOff atomic.Bool

// sent counts n data messages carrying bytes in all. Called with Conn.mu held.
func (s *connStats) sent(n, bytes int) {
	if StatsOff.Load() {
		return
	}
	s.msgsSent += uint64(n)
	s.bytesSent += uint64(bytes)
}

// placedInto counts one placement of n bytes into a Read's buffer, a data message
// received too. Called with Conn.mu held.
func (s *connStats) placedInto(n int) {
	s.received(n)
	if StatsOff.Load() {
		return
	}
	s.placed++
	s.bytesPlaced += uint64(n)
}

// received counts one data message of n bytes. Called with Conn.mu held.
func (s *connStats) received(n int) {
	if StatsOff.Load() {
		return
	}
	s.msgsRecv++
	s.bytesRecv += uint64(n)
}

// completionFailed counts a failed work completion of status st.
func (s *connStats) completionFailed(st verbs.WCStatus) {
	s.wcErrors.Add(1)
	if st == verbs.WCRNRRetryExcErr {
		s.rnrErrors.Add(1)
	}
}

// creditStall times one credit stall of a writer: from the first time it finds no room
// because the peer has granted no credit until the call that found none returns (having
// posted, or given up), spun and parked alike, counted once. Only a stalled writer reads
// the clock.
type creditStall struct{ start time.Time }

// noCredit marks the writer as stalled on credit, if it is not already.
func (s *creditStall) noCredit() {
	if s.start.IsZero() && !StatsOff.Load() {
		s.start = time.Now()
	}
}

// end counts the stall on c, if there was one.
func (s *creditStall) end(c *Conn) {
	if !s.start.IsZero() {
		c.stats.stallEnd(s.start)
		s.start = time.Time{}
	}
}

// stallEnd counts a credit stall that began at start and tells the hook.
func (s *connStats) stallEnd(start time.Time) {
	d := time.Since(start)
	s.stalls.Add(1)
	s.stallNanos.Add(int64(d))
	if h := s.hooks.Load(); h != nil && h.CreditStall != nil {
		h.CreditStall(d)
	}
}

// failed tells the hook about the Conn's first failure err. Called with mu held, so
// the hook runs on its own goroutine: it may call back into the Conn.
func (s *connStats) failed(err error) {
	if h := s.hooks.Load(); h != nil && h.Failed != nil {
		go h.Failed(err)
	}
}

// SetHooks installs the hooks h (nil removes them). Events before the call are not
// reported.
func (c *Conn) SetHooks(h *Hooks) { c.stats.hooks.Store(h) }

// Stats returns the Conn's counters and buffer occupancy. It takes the Conn's mutex
// briefly (for the counts and occupancies that change under it) and allocates nothing, so it is
// cheap enough to call on every request. It may be called after Close.
func (c *Conn) Stats() Stats {
	s := &c.stats
	st := Stats{
		CreditStalls:     s.stalls.Load(),
		CreditStallTime:  time.Duration(s.stallNanos.Load()),
		CompletionErrors: s.wcErrors.Load(),
		RNRErrors:        s.rnrErrors.Load(),
	}
	c.mu.Lock()
	st.MessagesSent, st.MessagesReceived = s.msgsSent, s.msgsRecv
	st.BytesSent, st.BytesReceived = s.bytesSent, s.bytesRecv
	st.Placements, st.BytesPlaced = s.placed, s.bytesPlaced
	st.RingSize = c.fc.RingSize()
	st.RingUsed = c.fc.Buffered()
	st.RecvWQEs = c.fc.WQEs()
	st.Spilled = c.spill.len()
	st.StagingSize = len(c.stage)
	st.StagingUsed = int(c.stageTail - c.stageHead)
	c.mu.Unlock()
	return st
}
