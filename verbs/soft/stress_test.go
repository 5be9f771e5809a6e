package soft_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// stream sends n writes-with-immediate from s to peer while reaping its own receive
// completions and reposting their WQEs, until it has sent n and received want, or a
// completion fails. It returns the first failed completion's status, or success.
func stream(s, peer *side, n, want int, deadline time.Time) (verbs.WCStatus, error) {
	var wc [16]verbs.WorkCompletion
	sent, acked, got := 0, 0, 0
	for acked < n || got < want {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("stuck: sent %d, acknowledged %d, received %d", sent, acked, got)
		}
		if sent < n && sent-acked < 8 {
			// Read from the first half of the own region, write to the second half of the
			// peer's, so the two directions never touch the same bytes.
			wr := writeImm(uint64(sent), s.mr, peer.mr, 64*(sent%16), 64)
			wr.RemoteAddr += 1 << 15
			if err := s.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				return 0, err
			}
			sent++
		}
		k, err := s.scq.Poll(wc[:])
		if err != nil {
			return 0, err
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.WCSuccess {
				return c.Status, nil
			}
			acked++
		}
		k, err = s.rcq.Poll(wc[:])
		if err != nil {
			return 0, err
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.WCSuccess {
				return c.Status, nil
			}
			got++
			if err := s.qp.PostRecv([]verbs.RecvWR{{ID: c.WRID}}); err != nil {
				return 0, err
			}
		}
	}
	return verbs.WCSuccess, nil
}

// TestBidirectionalStream has two QPs stream to each other at once, which exercises the
// lock order (each holds its send queue while taking the other's receive queue).
func TestBidirectionalStream(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{rnrTimer: 1})
	for _, s := range []*side{a, b} {
		for i := range 16 {
			require.NoError(t, s.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
		}
	}
	// 1000 writes each way cross the two locks some thousands of times; 3000 took three
	// times as long for no new interleaving.
	const n = 1000
	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	results := make([]error, 2)
	for i, pair := range [][2]*side{{a, b}, {b, a}} {
		wg.Go(func() {
			st, err := stream(pair[0], pair[1], n, n, deadline)
			if err == nil && st != verbs.WCSuccess {
				err = fmt.Errorf("completion status %v", st)
			}
			results[i] = err
		})
	}
	wg.Wait()
	require.NoError(t, results[0])
	require.NoError(t, results[1])
	require.Equal(t, uint64(2*n), f.Stats().WRs)
}

// TestFailDuringStream fails one QP while both stream: both streams must end with an error
// completion (a flush on the failed side, a transport error on the other), not hang.
func TestFailDuringStream(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{rnrTimer: 1, retry: 1})
	for _, s := range []*side{a, b} {
		for i := range 16 {
			require.NoError(t, s.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	statuses := make([]verbs.WCStatus, 2)
	errs := make([]error, 2)
	for i, pair := range [][2]*side{{a, b}, {b, a}} {
		wg.Go(func() { statuses[i], errs[i] = stream(pair[0], pair[1], 1<<30, 1<<30, deadline) })
	}
	for f.Stats().WRs < 200 {
		// Paces the wait for traffic that must start; a stress test of real
		// goroutines on real time, which synctest would serialise.
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, f.FailQP(a.qp))
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, verbs.WCWRFlushErr, statuses[0], "failed QP")
	require.Contains(t, []verbs.WCStatus{verbs.WCRetryExcErr, verbs.WCWRFlushErr}, statuses[1], "its peer")
}

// TestDataPathAllocs checks that posting and polling allocate nothing.
func TestDataPathAllocs(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	send := []verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 256)}
	inline := []verbs.SendWR{writeImm(2, a.mr, b.mr, 0, 32)}
	inline[0].Flags |= verbs.SendInline
	recv := []verbs.RecvWR{{ID: 1}}
	wc := make([]verbs.WorkCompletion, 4)
	allocs := testing.AllocsPerRun(1000, func() {
		_ = b.qp.PostRecv(recv)
		_ = b.qp.PostRecv(recv)
		_ = a.qp.PostSend(send)
		_ = a.qp.PostSend(inline)
		_, _ = a.scq.Poll(wc)
		_, _ = b.rcq.Poll(wc)
	})
	require.Zero(t, allocs, "allocations per post and poll")
	require.Equal(t, verbs.QPStateRTS, a.qp.State())
	require.Zero(t, f.Stats().RNRNAKs)
}
