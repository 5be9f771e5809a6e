package rdma

import (
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
		{"spilled", Options{RingSize: 16 << 10, GrowRingTo: -1, ReadBufferSize: 1 << 20}, 40 << 10, 0, 40 << 10},
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
