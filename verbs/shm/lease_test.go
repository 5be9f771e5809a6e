package shm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// busyPoll polls cq n times, expecting nothing: the polls of a spinning consumer, which
// readLoop and serve leave their rings to.
func busyPoll(t *testing.T, cq verbs.CQ, n int) {
	t.Helper()
	var wc [4]verbs.WorkCompletion
	for range n {
		k, err := cq.Poll(wc[:])
		require.NoError(t, err)
		require.Zero(t, k)
	}
}

// TestLeasable: readLoop leaves the response ring to the polls of its send CQ only
// while they drive it (polled since its last look, not armed), for the QP's current
// connection, and with no region query awaiting its answer on the socket.
func TestLeasable(t *testing.T) {
	x, _ := connectedPair(t, newProvider(t, 2))
	q := x.qp.(*QP)
	pc := q.out.Load()
	require.NotNil(t, pc)
	cq := x.cq.(*CQ)

	for _, tc := range []struct {
		name   string
		before func()
		after  func()
		want   bool
	}{
		{"polled", func() { busyPoll(t, x.cq, 1) }, nil, true},
		{"not polled since the last look", nil, nil, false},
		{"polled, then armed", func() { busyPoll(t, x.cq, 1); require.NoError(t, x.cq.ReqNotify(false)) },
			func() { busyPoll(t, x.cq, 1) }, false}, // the poll disarms
		{"polled, a region query out", func() { busyPoll(t, x.cq, 1); pc.querying.Store(true) },
			func() { pc.querying.Store(false) }, false},
		{"polled, not the QP's connection", func() { busyPoll(t, x.cq, 1); q.out.Store(nil) },
			func() { q.out.Store(pc) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := pollWatch{cq: cq, seen: cq.polls.Load()}
			if tc.before != nil {
				tc.before()
			}
			require.Equal(t, tc.want, pc.leasable(&w))
			if tc.after != nil {
				tc.after()
			}
		})
	}
}

// spinWait polls cq without pause until it has one completion, failing the test after
// 20 s (a bound, not a timing): a consumer that keeps readLoop leased throughout.
func spinWait(t *testing.T, cq verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	var wc [1]verbs.WorkCompletion
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		n, err := cq.Poll(wc[:])
		require.NoError(t, err)
		if n == 1 {
			return wc[0]
		}
		if i%1024 == 0 {
			require.False(t, time.Now().After(deadline), "waited 20 s for a completion")
		}
	}
}

// TestRegionQueryWhilePolled: a requester whose send CQ is busily polled (readLoop
// leased: signaled writes complete through the polls) writes to a region it has not
// mapped: the query's answer, which comes on the socket, is read all the same, and the
// write completes. With an ACK timeout of 0 a lost answer would never be retried: the
// bound is the only way out.
func TestRegionQueryWhilePolled(t *testing.T) {
	p := newProvider(t, 2)
	x := newEnd(t, p, "shm0", 4096)
	y := newEnd(t, p, "shm1", 4096)
	connectEnds(t, x, y, 0, 7)
	for i, size := range []int{4096, 1 << 16, 4096} {
		mr, err := y.pd.RegMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		require.NoError(t, err)
		defer mr.Close()
		for k := range 20 { // readLoop takes its lease
			wr := writeImm(uint64(k), x.mr, y.mr, 0, 8)
			wr.Opcode = verbs.OpRDMAWrite
			require.NoError(t, x.qp.PostSend([]verbs.SendWR{wr}))
			require.Equal(t, verbs.WCSuccess, spinWait(t, x.cq).Status)
		}
		copy(x.mr.Bytes(), "new ring")
		wr := writeImm(uint64(i), x.mr, mr, 0, 8)
		wr.Opcode = verbs.OpRDMAWrite
		require.NoError(t, x.qp.PostSend([]verbs.SendWR{wr}))
		require.Equal(t, verbs.WCSuccess, spinWait(t, x.cq).Status)
		require.Equal(t, "new ring", string(mr.Bytes()[:8]))
	}
}

// TestArmedSendCQWakes: a send CQ that was being polled (readLoop leased, no
// doorbells for responses) and is then armed raises its event for the next signaled
// completion: arming ends the lease and makes the responder ring again. Rounds
// alternate the request before and after the arming.
func TestArmedSendCQWakes(t *testing.T) {
	p := newProvider(t, 2)
	x, xch := newEventEnd(t, p, "shm0", 4096)
	y := newEnd(t, p, "shm1", 4096)
	connectEnds(t, x, y, 0, 7)
	var wc [4]verbs.WorkCompletion
	for round := range 40 {
		require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{{ID: uint64(round)}}))
		busyPoll(t, x.cq, 50)
		early := round%2 == 0
		if early {
			require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(uint64(round), x.mr, y.mr, 0, 8)}))
		}
		require.NoError(t, x.cq.ReqNotify(false))
		n, err := x.cq.Poll(wc[:]) // the look after arming
		require.NoError(t, err)
		if !early {
			require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(uint64(round), x.mr, y.mr, 0, 8)}))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a bound, not a timing
		for n == 0 {
			_, err := xch.Wait(ctx)
			require.NoError(t, err, "round %d (request before arming: %v): no event", round, early)
			if n, err = x.cq.Poll(wc[:]); err == nil && n == 0 {
				require.NoError(t, x.cq.ReqNotify(false))
				n, err = x.cq.Poll(wc[:])
			}
			require.NoError(t, err)
		}
		cancel()
		require.Equal(t, 1, n, "round %d: send completions", round)
		require.Equal(t, verbs.WCSuccess, wc[0].Status)
		require.Equal(t, uint64(round), wc[0].WRID)
		require.Equal(t, verbs.WCSuccess, pollWait(t, y.cq, 1)[0].Status)
	}
}
