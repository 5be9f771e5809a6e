package rdma

import (
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// statsOptions is a fixed 16 KiB ring and no spill buffer: a reader that does not read
// stalls the writer once 16 KiB are in flight.
var statsOptions = Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10, ReadBufferSize: -1}

// TestStatsCreditStall has a reader that reads only once the writer has filled its
// ring: the writer must stall on credit, and Stats and the hook must both say so.
func TestStatsCreditStall(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, statsOptions)
	var mu sync.Mutex
	var hooked []time.Duration
	a.SetHooks(&Hooks{CreditStall: func(d time.Duration) {
		mu.Lock()
		hooked = append(hooked, d)
		mu.Unlock()
	}})

	const total = 64 << 10
	wrote := make(chan error, 1)
	go func() {
		_, err := a.Write(make([]byte, total))
		wrote <- err
	}()
	// The ring fills; the writer, with 48 KiB left, has no credit and waits.
	require.Eventually(t, func() bool { return b.Stats().RingUsed == statsOptions.RingSize },
		10*time.Second, time.Millisecond, "the ring never filled: %+v", b.Stats())
	_, err := io.ReadFull(b, make([]byte, total))
	require.NoError(t, err)
	require.NoError(t, <-wrote)

	sa, sb := a.Stats(), b.Stats()
	require.Positive(t, sa.CreditStalls, "writer's stats: %+v", sa)
	require.Positive(t, sa.CreditStallTime, "writer's stats: %+v", sa)
	require.Equal(t, uint64(total), sa.BytesSent, "writer's stats: %+v", sa)
	require.Equal(t, uint64(total), sb.BytesReceived, "reader's stats: %+v", sb)
	require.Equal(t, sa.MessagesSent, sb.MessagesReceived, "messages sent by a and received by b")
	require.GreaterOrEqual(t, sa.MessagesSent, uint64(total/statsOptions.RingSize), "a 16 KiB ring takes 64 KiB in pieces")
	require.Zero(t, sb.CreditStalls, "the reader wrote nothing: %+v", sb)
	require.Zero(t, sb.RingUsed, "everything was read: %+v", sb)

	mu.Lock()
	var sum time.Duration
	for _, d := range hooked {
		sum += d
	}
	require.Len(t, hooked, int(sa.CreditStalls), "the hook hears of every stall")
	require.Equal(t, sa.CreditStallTime, sum, "the hook's waits add up to CreditStallTime")
	mu.Unlock()

	a.Close()
	b.Close()
	requireReleased(t, f)
}

// TestStatsOccupancy checks the occupancies against what was written and not read.
func TestStatsOccupancy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		written int
		ring    int // want RingUsed
		spilled int // want Spilled
	}{
		{"nothing", statsOptions, 0, 0, 0},
		{"ring only", statsOptions, 5000, 5000, 0},
		{"ring full", statsOptions, 16 << 10, 16 << 10, 0},
		// Each time the writer runs out of ring credit, the ring spills; the last 8 KiB
		// stay in it, as the writer holds credit for 8 KiB more.
		{"spilled", Options{RingSize: 16 << 10, GrowRingTo: -1, ReadBufferSize: 1 << 20}, 40 << 10, 8 << 10, 32 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			a, b := connPair(t, f, tc.opts)
			if tc.written > 0 {
				_, err := a.Write(make([]byte, tc.written))
				require.NoError(t, err)
			}
			// Writes return once posted; wait for them to land.
			require.Eventually(t, func() bool { return int(b.Stats().BytesReceived) == tc.written },
				10*time.Second, time.Millisecond)
			sb := b.Stats()
			require.Equal(t, tc.ring, sb.RingUsed, "RingUsed after writing %d: %+v", tc.written, sb)
			require.Equal(t, tc.spilled, sb.Spilled, "Spilled after writing %d: %+v", tc.written, sb)
			require.Equal(t, tc.opts.RingSize, sb.RingSize, "RingSize: %+v", sb)
			sa := a.Stats()
			require.Positive(t, sa.StagingSize, "writer's staging: %+v", sa)
			require.LessOrEqual(t, sa.StagingUsed, sa.StagingSize, "writer's staging: %+v", sa)
			a.Close()
			b.Close()
			requireReleased(t, f)
		})
	}
}

// TestStatsFailure checks that a failed QP counts its failed completions (its posted
// receive WQEs flush) and that the hook hears of the failure.
func TestStatsFailure(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, statsOptions)
	failed := make(chan error, 1)
	a.SetHooks(&Hooks{Failed: func(err error) { failed <- err }})
	require.NoError(t, f.FailQP(a.ep.qp))
	require.ErrorIs(t, <-failed, ErrQPFailed)
	require.Eventually(t, func() bool { return a.Stats().CompletionErrors > 0 }, 10*time.Second, time.Millisecond)
	require.Zero(t, a.Stats().RNRErrors, "flushes are not RNR")
	a.Close()
	b.Close()
	requireReleased(t, f)
}

// TestStatsCompletionFailed checks how failed completions are classified.
func TestStatsCompletionFailed(t *testing.T) {
	for _, tc := range []struct {
		st      verbs.WCStatus
		wc, rnr uint64
	}{
		{verbs.WCWRFlushErr, 1, 0},
		{verbs.WCRetryExcErr, 1, 0},
		{verbs.WCRNRRetryExcErr, 1, 1},
	} {
		var s connStats
		s.completionFailed(tc.st)
		if s.wcErrors.Load() != tc.wc || s.rnrErrors.Load() != tc.rnr {
			t.Errorf("completionFailed(%v): %d errors, %d RNR; want %d, %d", tc.st, s.wcErrors.Load(), s.rnrErrors.Load(), tc.wc, tc.rnr)
		}
	}
}

// TestStatsOnFake counts on a fake Conn, in a synctest bubble: a Write that runs out of
// ring credit stalls until a credit update arrives, one stall as long as the bubble's
// clock advanced, which the hook hears of; messages and bytes each way, ring and
// staging occupancy; a failed completion, RNR or not, which the failure hook hears of.
func TestStatsOnFake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const peerRing = MinRingSize // smaller than the staging buffer: credit runs out first
		q := &fakeQP{}
		c := newFakeConn(t, q)
		fc, err := flowctl.MakeEndpoint(flowctl.Params{RingSize: fakeRing, RecvWQEs: fakeWQEs},
			flowctl.Params{RingSize: peerRing, RecvWQEs: fakeWQEs})
		require.NoError(t, err)
		c.fc = fc
		var stalls []time.Duration
		failures := make(chan error, 2)
		c.SetHooks(&Hooks{
			CreditStall: func(d time.Duration) { stalls = append(stalls, d) },
			Failed:      func(err error) { failures <- err },
		})

		const total = peerRing + 2000
		wrote := make(chan error, 1)
		go func() {
			_, err := c.Write(make([]byte, total))
			wrote <- err
		}()
		synctest.Wait() // out of credit after peerRing bytes
		// Half way, a send completion wakes the writer, still without credit: the
		// stall goes on, one stall.
		time.Sleep(time.Second / 2)
		var freed uint64
		var signaled uint64
		for _, wr := range q.posted() {
			if wr.Flags&verbs.SendSignaled != 0 {
				signaled = wr.ID
			}
		}
		for _, wr := range q.posted()[:signaled+1] {
			freed += uint64(wr.SGL[0].Length)
		}
		c.onCompletion(sendDone(signaled))
		synctest.Wait()
		time.Sleep(time.Second / 2)
		imm, err := flowctl.Imm{Kind: flowctl.KindCredit, RingCredits: uint32(peerRing / flowctl.RingUnit(peerRing))}.Encode()
		require.NoError(t, err)
		c.onCompletion(&verbs.WorkCompletion{WRID: recvWRFlag, Status: verbs.WCSuccess,
			Opcode: verbs.WCRecvRDMAWithImm, Flags: verbs.WCWithImm, Imm: imm})
		require.NoError(t, <-wrote)
		arrive(t, c, 1, flowctl.KindData, 0, "hello")

		s := c.Stats()
		require.Equal(t, uint64(1), s.CreditStalls, "%+v", s)
		require.Equal(t, time.Second, s.CreditStallTime, "%+v", s)
		require.Equal(t, []time.Duration{time.Second}, stalls, "stalls the hook heard of")
		require.Equal(t, uint64(len(q.posted())), s.MessagesSent, "%+v", s)
		require.Equal(t, uint64(total), s.BytesSent, "%+v", s)
		require.Equal(t, uint64(1), s.MessagesReceived, "credit updates are not counted: %+v", s)
		require.Equal(t, uint64(5), s.BytesReceived, "%+v", s)
		require.Equal(t, fakeRing, s.RingSize, "%+v", s)
		require.Equal(t, 5, s.RingUsed, "%+v", s)
		require.Zero(t, s.Spilled, "%+v", s)
		require.Equal(t, fakeStage, s.StagingSize, "%+v", s)
		require.Equal(t, total-int(freed), s.StagingUsed, "%d bytes written, %d completed: %+v", total, freed, s)
		require.Zero(t, s.CompletionErrors+s.RNRErrors, "%+v", s)

		c.onCompletion(&verbs.WorkCompletion{WRID: 0, Status: verbs.WCWRFlushErr})
		c.onCompletion(&verbs.WorkCompletion{WRID: 1, Status: verbs.WCRNRRetryExcErr})
		c.onCompletion(&verbs.WorkCompletion{WRID: 2, Status: verbs.WCWRFlushErr})
		s = c.Stats()
		require.Equal(t, uint64(3), s.CompletionErrors, "%+v", s)
		require.Equal(t, uint64(1), s.RNRErrors, "%+v", s)
		require.ErrorIs(t, <-failures, ErrQPFailed)
		synctest.Wait()
		require.Empty(t, failures, "the failure hook runs once per Conn")
	})
}
