package rdma

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
)

// yieldingCQ is a fake CQ whose polls say they yield the processor, or not.
type yieldingCQ struct {
	*fakeCQ
	yields bool
}

func (c yieldingCQ) PollYields() bool { return c.yields }

// newSHMCQ is a CQ of a device of a fresh shm provider, all closed when the test ends.
func newSHMCQ(t *testing.T) completionQueue {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	ctx, err := p.Open("shm0")
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Close() })
	cq, err := ctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	t.Cleanup(func() { cq.Close() })
	return cq
}

// TestCQYields: the engine skips its own Gosched only on CQs that say their empty
// polls yield the processor now: verbs/shm's can (it has PollYields); soft's, and a
// CQ without the method or whose method says false, do not.
func TestCQYields(t *testing.T) {
	shmCQ := newSHMCQ(t)
	f := soft.New(soft.Options{})
	devs, err := f.Devices()
	require.NoError(t, err)
	sctx, err := f.Open(devs[0].Name)
	require.NoError(t, err)
	defer sctx.Close()
	softCQ, err := sctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	defer softCQ.Close()

	for _, tc := range []struct {
		name       string
		cq         completionQueue
		hasYielder bool
		want       bool
		provider   bool
	}{
		{name: "shm", cq: shmCQ, hasYielder: true, provider: true},
		{name: "soft", cq: softCQ},
		{name: "no PollYields", cq: newFakeCQ()},
		{name: "PollYields false", cq: yieldingCQ{newFakeCQ(), false}, hasYielder: true},
		{name: "PollYields true", cq: yieldingCQ{newFakeCQ(), true}, hasYielder: true, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &poller{cq: tc.cq, yielder: cqYielder(tc.cq)}
			require.Equal(t, tc.hasYielder, p.yielder != nil)
			if tc.provider { // shm's answer depends on the host's load: it is its own
				require.Equal(t, tc.cq.(pollYielder).PollYields(), p.yields())
				return
			}
			require.Equal(t, tc.want, p.yields())
		})
	}
}

// outsideCQ is a fake CQ that says it is filled outside the process, as verbs/ibv's.
type outsideCQ struct{ *fakeCQ }

func (outsideCQ) FilledOutside() bool { return true }

// onHostCQ is a fake CQ filled outside the process by this host's cores, as verbs/ibv's
// on Soft-RoCE.
type onHostCQ struct{ outsideCQ }

func (onHostCQ) FilledOnHost() bool { return true }

// countingYielder counts pause's yields of each kind.
type countingYielder struct {
	gosched, yield int
	contended      bool
}

func (y *countingYielder) Gosched()        { y.gosched++ }
func (y *countingYielder) Yield()          { y.yield++ }
func (y *countingYielder) Contended() bool { return y.contended }

// TestPause: over outsideGoschedEvery empty polls, a spinner on a CQ this process's
// goroutines fill (soft's) yields with runtime.Gosched after every one; on a CQ that
// yields by itself (shm's, host quiet), not at all, unless spinners may hold every
// processor (one processor, or as many spinners as processors), when it Goscheds after
// every one too; on one filled outside (ibv's), it
// yields its thread after every outsideYieldEvery-th by cpuyield's policy and Goscheds
// after the last, and on a contended host Goscheds instead of every thread yield; on
// one filled on this host (ibv's on Soft-RoCE), it never yields its thread, contended
// or not, and Goscheds after the last.
func TestPause(t *testing.T) {
	const polls = outsideGoschedEvery
	perYield := polls / outsideYieldEvery
	for _, tc := range []struct {
		name               string
		cq                 completionQueue
		contended          bool
		procs, spinners    int32 // 0: two processors, one spinner
		wantGosched, wantY int
	}{
		{name: "soft", cq: newFakeCQ(), wantGosched: polls},
		{name: "soft, contended", cq: newFakeCQ(), contended: true, wantGosched: polls},
		{name: "yields by itself", cq: yieldingCQ{newFakeCQ(), true}},
		{name: "yields by itself, one processor", cq: yieldingCQ{newFakeCQ(), true}, procs: 1, spinners: 1, wantGosched: polls},
		{name: "yields by itself, one processor, the goroutine's spin", cq: yieldingCQ{newFakeCQ(), true}, procs: 1, spinners: 0, wantGosched: polls},
		{name: "yields by itself, every processor spins", cq: yieldingCQ{newFakeCQ(), true}, procs: 2, spinners: 2, wantGosched: polls},
		{name: "does not yield now", cq: yieldingCQ{newFakeCQ(), false}, wantGosched: polls},
		{name: "filled outside", cq: outsideCQ{newFakeCQ()}, wantGosched: 1, wantY: perYield - 1},
		{name: "filled outside, contended", cq: outsideCQ{newFakeCQ()}, contended: true, wantGosched: perYield},
		{name: "filled on this host", cq: onHostCQ{outsideCQ{newFakeCQ()}}, wantGosched: 1},
		{name: "filled on this host, contended", cq: onHostCQ{outsideCQ{newFakeCQ()}}, contended: true, wantGosched: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := &countingYielder{contended: tc.contended}
			p := &poller{cq: tc.cq, yielder: cqYielder(tc.cq), outside: filledOutside(tc.cq), onHost: filledOnHost(tc.cq), sched: y}
			procs, spinners := int32(2), int32(1)
			if tc.procs > 0 {
				procs, spinners = tc.procs, tc.spinners
			}
			defer setSpinning(procs, spinners)()
			for empties := 1; empties <= polls; empties++ {
				p.pause(empties)
			}
			require.Equal(t, tc.wantGosched, y.gosched, "runtime.Gosched calls")
			require.Equal(t, tc.wantY, y.yield, "thread yields by cpuyield's policy")
		})
	}
}

// setSpinning makes the process look as if it had procs processors and spinners
// waiters spinning (everyProcessorSpins), until restore is called.
func setSpinning(procs, spinners int32) (restore func()) {
	oldProcs, oldSpinners := processors, spinningWaiters.Load()
	processors = func() int32 { return procs }
	spinningWaiters.Store(spinners)
	return func() {
		processors = oldProcs
		spinningWaiters.Store(oldSpinners)
	}
}

// TestSpinnersCountedAcrossPollers: waiters spinning on two pollers (two devices, or a
// device whose CQs filled) count together toward every processor spinning, each
// counted from its beginSpin to its endSpin.
func TestSpinnersCountedAcrossPollers(t *testing.T) {
	defer setSpinning(2, 0)()
	a := &poller{spin: 8, maxSpinners: 2}
	b := &poller{spin: 8, maxSpinners: 2}
	ca, cb := &Conn{poll: a}, &Conn{poll: b}
	require.False(t, a.everyProcessorSpins())
	require.Equal(t, 8, ca.beginSpin(false))
	require.False(t, a.everyProcessorSpins(), "one of two processors spins")
	require.Equal(t, 8, cb.beginSpin(false))
	require.True(t, a.everyProcessorSpins(), "one spinner on each poller: both processors")
	require.True(t, b.everyProcessorSpins())
	b.endSpin()
	require.False(t, a.everyProcessorSpins())
	a.endSpin()
	require.Zero(t, spinningWaiters.Load())
}

// TestProcessorsRead: processors is GOMAXPROCS, read again once procsMaxAge has
// passed.
func TestProcessorsRead(t *testing.T) {
	require.Equal(t, int32(runtime.GOMAXPROCS(0)), processors())
	procsReadAt.Store(int64(time.Since(procsEpoch) - procsMaxAge))
	procsCached.Store(99)
	require.Equal(t, int32(runtime.GOMAXPROCS(0)), processors(), "read again once old")
}

// TestAnswerSpinOutside: on a CQ filled outside, the spin of a Read that waits for an
// answer counts yields: it makes outsideYieldEvery times as many polls before it
// parks, and onHostAnswerScale times that on one filled on this host, whose polls do
// not yield; any other wait makes the poller's spin in polls, as every wait on any
// other CQ does.
func TestAnswerSpinOutside(t *testing.T) {
	for _, tc := range []struct {
		name          string
		cq            completionQueue
		answer, other int
	}{
		{"soft", newFakeCQ(), 5, 5},
		{"filled outside", outsideCQ{newFakeCQ()}, 5 * outsideYieldEvery, 5},
		{"filled on this host", onHostCQ{outsideCQ{newFakeCQ()}}, 5 * outsideYieldEvery * onHostAnswerScale, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakePoller(nil, 64, 5)
			p.cq, p.outside, p.onHost = tc.cq, filledOutside(tc.cq), filledOnHost(tc.cq)
			c := &Conn{poll: p}
			for _, answer := range []bool{true, false} {
				s := spin{c: c, answer: answer}
				polls := 0
				for s.more() {
					polls++
				}
				s.end()
				want := map[bool]int{true: tc.answer, false: tc.other}[answer]
				require.Equal(t, want, polls, "polls of a waiter (an answer: %v) before it parks", answer)
				require.Zero(t, p.spinners.Load(), "slots held after the spin")
			}
		})
	}
}

// readWaits returns a function that makes one Read of c find nothing, then the arrival
// of one byte, and returns the empty polls the Read made before it parked: for tests in
// a synctest bubble on a pollingConn.
func readWaits(t *testing.T, c *Conn, cq *fakeCQ, q *fakeQP) func() uint64 {
	arrivals := 0
	return func() uint64 {
		t.Helper()
		before := c.poll.emptied.Load()
		done := make(chan string, 1)
		go func() {
			buf := make([]byte, 16)
			n, _ := c.Read(buf)
			done <- string(buf[:n])
		}()
		synctest.Wait() // parked on readable
		polls := c.poll.emptied.Load() - before
		copy(c.ring[arrivals:], "x") // one byte per arrival, from the ring's start
		arrivals++
		cq.push(dataArrival(t, q.qpn, uint64(arrivals), 1))
		require.Equal(t, 1, c.poll.pollFor(q.qpn, c), "the poller's dispatch")
		require.Equal(t, "x", <-done)
		return polls
	}
}

// TestReadAfterWriteAwaitsAnswer: on a CQ filled outside, a Read that follows a Write
// on the same Conn waits for an answer, once, and spins outsideYieldEvery times as
// long before it parks as a Read that follows a Read. On any other CQ, no Read does.
func TestReadAfterWriteAwaitsAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, cq, q := pollingConn(t, 3)
		c.poll.outside = true
		c.poll.sched = &countingYielder{}
		waitedPolls := readWaits(t, c, cq, q)
		require.False(t, c.awaitsAnswer(), "a new Conn awaits an answer")
		require.Equal(t, uint64(3), waitedPolls(), "a Read with no Write before it")
		_, err := c.Write([]byte("q"))
		require.NoError(t, err)
		require.Equal(t, uint64(3*outsideYieldEvery), waitedPolls(), "a Read after a Write")
		require.Equal(t, uint64(3), waitedPolls(), "a second Read after that Write")

		// On a CQ this process fills, nothing spins an answer longer: a Read neither
		// takes the mark nor reads it.
		c.poll.outside = false
		_, err = c.Write([]byte("q"))
		require.NoError(t, err)
		require.False(t, c.awaitsAnswer(), "an answer awaited on a CQ not filled outside")
		require.True(t, c.wrote.Load(), "the mark taken on a CQ not filled outside")
	})
}

// TestPollerFillers: a connection's poller takes what fills its CQ from the CQ itself:
// soft's CQ neither outside the process nor on the host's cores; verbs/ibv's outside,
// and on the host's cores exactly when its device is Soft-RoCE, which every rxe device
// is (the Soft-RoCE VM names them rxe_*).
func TestPollerFillers(t *testing.T) {
	for _, pv := range providersUnderTest(t) {
		t.Run(pv.name, func(t *testing.T) {
			w, r := connPair(t, pv.p, Options{})
			defer w.Close()
			defer r.Close()
			attr := w.ep.dev.attr
			if pv.f != nil {
				require.False(t, w.poll.outside, "soft's CQ filled outside")
				require.False(t, w.poll.onHost, "soft's CQ filled on the host's cores")
				return
			}
			t.Logf("device %s, Soft-RoCE %v", attr.Name, attr.SoftRoCE)
			require.True(t, w.poll.outside, "%s's CQ filled outside", pv.name)
			require.Equal(t, attr.SoftRoCE, w.poll.onHost, "CQ of %s filled on the host's cores", attr.Name)
			require.Equal(t, strings.HasPrefix(attr.Name, "rxe"), attr.SoftRoCE, "%s is Soft-RoCE", attr.Name)
		})
	}
}

// drivingFlag is a pollDriver whose answer the test sets.
type drivingFlag struct{ drives atomic.Bool }

func (d *drivingFlag) PollDrives() bool { return d.drives.Load() }

// TestNoSpinWhereFutile: a Read that finds nothing spins its polls before it parks
// while the CQ's polls drive what fills it, and parks at once when they do not
// (pollDriver): its spin would only keep a processor from the goroutines that do.
func TestNoSpinWhereFutile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, cq, q := pollingConn(t, 3)
		d := &drivingFlag{}
		c.poll.driver = d
		waitedPolls := readWaits(t, c, cq, q)
		d.drives.Store(true)
		require.Equal(t, uint64(3), waitedPolls(), "polls that drive")
		d.drives.Store(false)
		require.Zero(t, waitedPolls(), "polls that drive nothing")
		require.Zero(t, c.poll.spinners.Load(), "slots held")
	})
}

// TestPollerDriverFromCQ: the poller takes its pollDriver from the CQ: shm's has one,
// which says its polls drive while few QPs feed it; a CQ without the method has none.
func TestPollerDriverFromCQ(t *testing.T) {
	shmCQ := newSHMCQ(t)
	d := cqDriver(shmCQ)
	require.NotNil(t, d, "shm's CQ")
	require.True(t, d.PollDrives(), "a CQ no QP feeds")
	require.Nil(t, cqDriver(newFakeCQ()))
	pl := &poller{cq: shmCQ, driver: d}
	require.False(t, pl.spinFutile())
}
