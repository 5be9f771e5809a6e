package rdma

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// TestPollerPollFor checks a waiting Read's or Write's poll: with the token free and
// its handler attached it reaps the CQ and dispatches every completion to its owner, in
// order; it does not poll while someone else holds the token, nor for a handler that is
// no longer attached (the CQ may be going away); an empty poll counts as caught up.
// The pollers here have no goroutine: the handlers are installed directly.
func TestPollerPollFor(t *testing.T) {
	wcs := []verbs.WorkCompletion{{WRID: 10, QPN: 1}, {WRID: 20, QPN: 2}, {WRID: 11, QPN: 1}}
	for _, tc := range []struct {
		name       string
		push       []verbs.WorkCompletion
		tokenTaken bool
		caller     uint32 // QPN the caller polls for; its handler is a unless detached
		detached   bool
		want       int
		wantA      []uint64
		wantB      []uint64
		wantLeft   int
		wantEmpty  uint64
	}{
		{name: "reaps for everyone", push: wcs, caller: 1, want: 3, wantA: []uint64{10, 11}, wantB: []uint64{20}},
		{name: "token taken", push: wcs, caller: 1, tokenTaken: true, want: -1, wantLeft: 3},
		{name: "caller detached", push: wcs, caller: 1, detached: true, want: -1, wantLeft: 3},
		{name: "another QP's handler", push: wcs, caller: 2, want: -1, wantLeft: 3},
		{name: "empty CQ", caller: 1, want: 0, wantEmpty: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cq := newFakeCQ()
			p := newFakePoller(cq, 64, 0)
			a, b := &recorder{}, &recorder{}
			p.handlers[2] = b
			if !tc.detached {
				p.handlers[1] = a
			}
			cq.push(tc.push...)
			if tc.tokenTaken {
				p.tok.Lock()
				defer p.tok.Unlock()
			}
			got := p.pollFor(tc.caller, a)
			require.Equal(t, tc.want, got, "pollFor(%d) with %d completions queued", tc.caller, len(tc.push))
			wa, _ := a.got()
			wb, _ := b.got()
			require.Equal(t, tc.wantA, wa, "dispatched to QP 1")
			require.Equal(t, tc.wantB, wb, "dispatched to QP 2")
			require.Len(t, cq.queue, tc.wantLeft, "completions left in the CQ")
			require.Equal(t, tc.wantEmpty, p.emptied.Load(), "empty polls counted")
		})
	}
}

// TestPollerPollForFailure: a CQ that fails under a waiting Read's poll fails the
// poller and tells every attached handler once, even when the goroutine, or another
// waiter, sees the failure too.
func TestPollerPollForFailure(t *testing.T) {
	cq := newFakeCQ()
	p := newFakePoller(cq, 64, 0)
	a, b := &recorder{}, &recorder{}
	p.handlers[1], p.handlers[2] = a, b
	cq.failWith(verbs.ErrCQOverflow)
	require.Equal(t, -1, p.pollFor(1, a))
	require.Equal(t, -1, p.pollFor(2, b), "a failed poller is not polled again")
	p.fail(verbs.ErrCQOverflow) // the goroutine's own sighting
	for _, r := range []*recorder{a, b} {
		_, errs := r.got()
		require.Len(t, errs, 1)
		require.ErrorIs(t, errs[0], verbs.ErrCQOverflow)
	}
	require.ErrorIs(t, p.attach(3, &recorder{}), verbs.ErrCQOverflow)
}

// TestPollerGoroutineYieldsToken: while a waiter holds the token, the goroutine's spin
// poll does not queue behind it and leaves the CQ alone; the poll after arming waits
// for the token, since a completion that landed before the arming raises no event.
func TestPollerGoroutineYieldsToken(t *testing.T) {
	cq := newFakeCQ()
	p := newFakePoller(cq, 64, 0)
	a := &recorder{}
	p.handlers[1] = a
	cq.push(verbs.WorkCompletion{WRID: 1, QPN: 1})
	p.tok.Lock()
	n, err := p.reap(false)
	require.NoError(t, err)
	require.Zero(t, n, "reaped with the token taken")
	require.Len(t, cq.queue, 1)
	p.tok.Unlock()
	n, err = p.reap(true)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	wa, _ := a.got()
	require.Equal(t, []uint64{1}, wa)
}

// TestWaiterLetsTokenHolderRun: a waiting Read that finds the CQ token taken yields the
// processor, so that a holder which is runnable but not running (just woken, or
// preempted) gets to dispatch the Read's data before the Read spins out and parks. Its
// poller believes in two processors (maxSpinners, read when it was made) where there
// is one now, as after GOMAXPROCS drops: a waiter that looked again at once, on the
// grounds that the holder runs on another processor, spun out here before the holder
// ran (this fails with that rule).
func TestWaiterLetsTokenHolderRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	c, _, q := pollingConn(t, 2000)
	require.EqualValues(t, 2, c.poll.maxSpinners)
	copy(c.ring, "hello")
	locked := make(chan struct{})
	parked := make(chan bool, 1)
	go func() {
		c.poll.tok.Lock()
		close(locked)
		runtime.Gosched() // runnable, not running, holding the token
		c.mu.Lock()
		parked <- c.readParked
		c.mu.Unlock()
		wc := dataArrival(t, q.qpn, 3, 5)
		c.onCompletion(&wc) // as the holder's dispatch would
		c.poll.tok.Unlock()
	}()
	<-locked
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf[:n]))
	require.False(t, <-parked, "the Read spun out while the token's holder waited for the processor")
}

// pollingConn returns a fake Conn whose poller has no goroutine: completions pushed on
// cq reach the Conn only through the polls of its own waiting Reads and Writes (or the
// test's). spin is the poller's spin, which bounds those polls.
func pollingConn(t *testing.T, spin int) (*Conn, *fakeCQ, *fakeQP) {
	t.Helper()
	q := &fakeQP{qpn: 5}
	c := newFakeConn(t, q)
	cq := newFakeCQ()
	c.poll = newFakePoller(cq, 64, spin)
	c.poll.handlers[q.qpn] = c
	return c, cq, q
}

// dataArrival is the receive completion of a data message of n bytes on WQE wqe of qpn.
func dataArrival(t *testing.T, qpn uint32, wqe uint64, n int) verbs.WorkCompletion {
	t.Helper()
	imm, err := flowctl.Imm{Kind: flowctl.KindData}.Encode()
	require.NoError(t, err)
	return verbs.WorkCompletion{
		WRID: recvWRFlag | wqe, QPN: qpn, Status: verbs.WCSuccess, Opcode: verbs.WCRecvRDMAWithImm,
		Flags: verbs.WCWithImm, Imm: imm, ByteLen: uint32(n),
	}
}

// TestReadPollsItself: a Read that finds nothing buffered reaps its data from the CQ
// itself: no goroutine runs the poller here, so the Read could not return otherwise.
// The arrival, dispatched to a reader that was not parked, leaves no signal behind.
func TestReadPollsItself(t *testing.T) {
	synctest.Test(t, testReadPollsItself) // a Read that waited for a goroutine would deadlock the bubble
}

func testReadPollsItself(t *testing.T) {
	c, cq, q := pollingConn(t, 4)
	copy(c.ring, "hello")
	cq.push(dataArrival(t, q.qpn, 3, 5))
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf[:n]))
	require.Empty(t, cq.queue)
	require.Len(t, c.readable, 0, "a signal for a reader that was not parked")
	q.mu.Lock()
	require.Equal(t, []verbs.RecvWR{{ID: recvWRFlag | 3}}, q.recvs, "the WQE re-posted by the reader's poll")
	q.mu.Unlock()
}

// TestWritePollsItself: a Write that finds the send queue full reaps the send
// completion that frees it from the CQ itself, with no poller goroutine running.
func TestWritePollsItself(t *testing.T) {
	synctest.Test(t, testWritePollsItself)
}

func testWritePollsItself(t *testing.T) {
	c, cq, q := pollingConn(t, 4)
	// Fill the send queue: fakeSQDepth one-byte writes, the last of them signaled
	// (postLocked signals every signalEvery-th).
	for range fakeSQDepth - 1 {
		_, err := c.Write([]byte{1})
		require.NoError(t, err)
	}
	c.mu.Lock()
	room := c.writeRoomLocked()
	c.mu.Unlock()
	require.Zero(t, room, "the send queue has room for a reservation")
	sends := q.posted()
	last := -1
	for i, wr := range sends {
		if wr.Flags&verbs.SendSignaled != 0 {
			last = i
		}
	}
	require.GreaterOrEqual(t, last, 0, "no signaled send among %d", len(sends))
	cq.push(verbs.WorkCompletion{WRID: sends[last].ID, QPN: q.qpn, Status: verbs.WCSuccess, Opcode: verbs.WCRDMAWrite})
	n, err := c.Write([]byte("more"))
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Empty(t, cq.queue)
	require.Len(t, c.writable, 0, "a signal for a writer that was not parked")
}

// TestParkedReaderIsSignaled: a Read that has spun out parks, says so, and the arrival
// that the poller (here the test) then dispatches wakes it. A reader that was not
// parked is not signaled (above); one that is must be, or it would sleep forever.
func TestParkedReaderIsSignaled(t *testing.T) {
	for _, spin := range []int{0, 3} {
		t.Run(map[int]string{0: "parks at once", 3: "spins first"}[spin], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, cq, q := pollingConn(t, spin)
				type result struct {
					s   string
					err error
				}
				done := make(chan result, 1)
				go func() {
					buf := make([]byte, 16)
					n, err := c.Read(buf)
					done <- result{string(buf[:n]), err}
				}()
				synctest.Wait() // parked on readable
				c.mu.Lock()
				parked := c.readParked
				c.mu.Unlock()
				require.True(t, parked, "a blocked Read is not marked parked")
				copy(c.ring, "wake")
				cq.push(dataArrival(t, q.qpn, 1, 4))
				require.Equal(t, 1, c.poll.pollFor(q.qpn, c), "the poller's dispatch")
				r := <-done
				require.NoError(t, r.err)
				require.Equal(t, "wake", r.s)
			})
		})
	}
}

// TestSpinSlots: a waiter spins only with one of the poller's slots, as many as its
// maxSpinners; it gives its slot back with its last poll, or when it ends early, once,
// so that another waiter may spin; without a slot, or with no spin configured, it parks
// at once.
func TestSpinSlots(t *testing.T) {
	c, _, _ := pollingConn(t, 3)
	c.poll.maxSpinners = 1
	slots := func() int32 { return c.poll.spinners.Load() }

	a, b := spin{c: c}, spin{c: c}
	require.False(t, a.parking(), "parking before the first wait")
	require.True(t, a.more(), "the first waiter spins")
	require.Equal(t, int32(1), slots())
	require.False(t, b.more(), "a second waiter spins past maxSpinners")
	require.True(t, b.parking())
	require.True(t, a.more())
	require.True(t, a.more(), "a third poll of three")
	require.Zero(t, slots(), "the last poll gives the slot back")
	require.False(t, a.more(), "a fourth poll of three")
	require.True(t, a.parking())
	a.end()
	require.Zero(t, slots(), "end after the last poll gives back nothing more")

	b.end() // progress: b spins afresh, with the free slot
	require.True(t, b.more())
	require.Equal(t, int32(1), slots())
	b.end()
	require.Zero(t, slots(), "end gives back the slot held")

	c.poll.spin = 0
	d := spin{c: c}
	require.False(t, d.more(), "spins with PollSpin off")
	d.end()
	require.Zero(t, slots())
}

// TestSpinScale: a spin of scale s makes s times the poller's polls before it parks,
// and keeps its scale when a later wait of the same call starts afresh.
func TestSpinScale(t *testing.T) {
	c, _, _ := pollingConn(t, 3)
	for _, tc := range []struct{ scale, want int }{{0, 3}, {1, 3}, {4, 12}} {
		s := spin{c: c, scale: tc.scale}
		for range 2 { // the second time after end: the call's next wait
			polls := 0
			for s.more() {
				polls++
			}
			require.Equal(t, tc.want, polls, "polls of a spin of scale %d", tc.scale)
			s.end()
		}
	}
	require.Zero(t, c.poll.spinners.Load(), "a slot still held")
}

// scriptedCQ is a fakeCQ on which something happens at the at-th poll: it runs do
// first, which pushes a completion, say.
type scriptedCQ struct {
	*fakeCQ
	at, polls int
	do        func()
}

func (s *scriptedCQ) Poll(wcs []verbs.WorkCompletion) (int, error) {
	s.polls++
	if s.polls == s.at {
		s.do()
	}
	return s.fakeCQ.Poll(wcs)
}

// yieldCounter yields as the runtime does, and counts the yields.
type yieldCounter struct{ n atomic.Int64 }

func (y *yieldCounter) Gosched()        { y.n.Add(1); runtime.Gosched() }
func (y *yieldCounter) Yield()          { y.Gosched() }
func (y *yieldCounter) Contended() bool { return false }

// TestWaiterYieldsToTokenHolderSometimes: a waiter that finds the poller's token taken
// yields to its holder every heldTokenYieldEvery-th time and looks again at once the
// other times; an empty CQ is paused on after every poll (soft's CQ: a Gosched).
func TestWaiterYieldsToTokenHolderSometimes(t *testing.T) {
	const polls = 4 * heldTokenYieldEvery
	for _, held := range []bool{true, false} {
		c, _, _ := pollingConn(t, polls)
		yields := &yieldCounter{}
		c.poll.sched = yields
		if held {
			c.poll.tok.Lock()
		}
		for i := 1; i <= polls; i++ {
			c.pollWaiting(i)
		}
		want := int64(polls)
		if held {
			want = polls / heldTokenYieldEvery
		}
		require.Equal(t, want, yields.n.Load(), "yields over %d polls, token held: %v", polls, held)
	}
}

// TestSpinningReadSeesChange: a spinning Read looks at what it may return (unread,
// under mu) only when something changed since its last look that found nothing
// (spin.quiet, readChanges), so whatever ends its wait must count as a change: data
// and a failed QP each end the Read at the poll that reaps them, and a Close within a
// few polls, not when the spin of a thousand polls runs out.
func TestSpinningReadSeesChange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		arrival func(t *testing.T, qpn uint32) verbs.WorkCompletion
		want    string
		wantErr error
	}{
		{name: "data", arrival: func(t *testing.T, qpn uint32) verbs.WorkCompletion { return dataArrival(t, qpn, 3, 5) }, want: "hello"},
		{name: "failure", arrival: func(t *testing.T, qpn uint32) verbs.WorkCompletion {
			return verbs.WorkCompletion{WRID: recvWRFlag | 3, QPN: qpn, Status: verbs.WCRetryExcErr}
		}, wantErr: ErrQPFailed},
		{name: "close", wantErr: net.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, cq, q := pollingConn(t, 1000)
				copy(c.ring, "hello")
				script := &scriptedCQ{fakeCQ: cq, at: 5}
				script.do = func() { cq.push(tc.arrival(t, q.qpn)) }
				if tc.arrival == nil {
					// Close tears down the Endpoint, and takes the poller's lock, which
					// the poll that starts it holds: it runs on a goroutine of its own,
					// and the poll returns once Close has marked the Conn closing, so
					// that the Read's next polls are what must see it. (The Read's
					// yields are only counted: without the wait, a Close not yet
					// scheduled when the Read spun out failed the test now and then.)
					c.ep, c.linger = &Endpoint{poller: c.poll}, -1
					script.do = func() {
						go c.Close()
						for !closing(c) {
							runtime.Gosched()
						}
					}
				}
				c.poll.cq = script
				yields := &yieldCounter{}
				c.poll.sched = yields
				buf := make([]byte, 16)
				n, err := c.Read(buf)
				require.Less(t, yields.n.Load(), int64(100), "the Read's yields between polls")
				if tc.arrival != nil {
					require.Equal(t, 5, script.polls, "polls before the Read returned")
				}
				if tc.wantErr != nil {
					require.ErrorIs(t, err, tc.wantErr)
					return
				}
				require.NoError(t, err)
				require.Equal(t, tc.want, string(buf[:n]))
			})
		})
	}
}

// closing reports whether c's Close has begun.
func closing(c *Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// TestReadFromReadsWithoutSpinSlot: a ReadFrom that spun for room gives its slot back
// before it reads from its reader, which may block for as long as it likes: the
// poller's goroutine stands by while a slot is held.
func TestReadFromReadsWithoutSpinSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, cq, q := pollingConn(t, 4)
		for range fakeSQDepth - 1 { // fill the send queue, as in TestWritePollsItself
			_, err := c.Write([]byte{1})
			require.NoError(t, err)
		}
		sends := q.posted()
		last := -1
		for i, wr := range sends {
			if wr.Flags&verbs.SendSignaled != 0 {
				last = i
			}
		}
		require.GreaterOrEqual(t, last, 0, "no signaled send among %d", len(sends))
		cq.push(verbs.WorkCompletion{WRID: sends[last].ID, QPN: q.qpn, Status: verbs.WCSuccess, Opcode: verbs.WCRDMAWrite})
		r := &slotProbe{c: c, data: []byte("more")}
		n, err := c.ReadFrom(r)
		require.NoError(t, err)
		require.Equal(t, int64(4), n)
		require.Empty(t, cq.queue, "the completion that made room, reaped by ReadFrom's spin")
		require.Equal(t, []int32{0, 0}, r.slots, "spinning slots held while ReadFrom read")
	})
}

// slotProbe is a reader that records, at each Read, how many spinning slots its Conn's
// poller has given out; it returns data, then io.EOF.
type slotProbe struct {
	c     *Conn
	data  []byte
	slots []int32
}

func (r *slotProbe) Read(p []byte) (int, error) {
	r.slots = append(r.slots, r.c.poll.spinners.Load())
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}
