package shm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// newEventEnd is newEnd with a CQ attached to a completion channel, which it returns.
func newEventEnd(t *testing.T, p verbs.Provider, dev string, mrSize int) (*end, verbs.CompChannel) {
	t.Helper()
	return newEndOn(t, p, dev, mrSize, true)
}

// TestArmedCQWakes: a CQ that was being polled (its rings left to the polls, no
// doorbells) and is then armed, as a poller does before it sleeps, raises its event for
// the next request: arming makes the peer ring again. Rounds alternate busy polling and
// sleeping, with requests landing before and after the arming.
func TestArmedCQWakes(t *testing.T) {
	p := newProvider(t, 2)
	x := newEnd(t, p, "shm0", 4096)
	y, ych := newEventEnd(t, p, "shm1", 4096)
	connectEnds(t, x, y, 0, 7)
	var wc [4]verbs.WorkCompletion
	for round := range 40 {
		require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{{ID: uint64(round)}}))
		for range 50 { // busy polling: serve leaves the ring to these polls
			n, err := y.cq.Poll(wc[:])
			require.NoError(t, err)
			require.Zero(t, n)
		}
		early := round%2 == 0 // the request lands before the arming, or after
		if early {
			require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(uint64(round), x.mr, y.mr, 0, 8)}))
		}
		require.NoError(t, y.cq.ReqNotify(false))
		n, err := y.cq.Poll(wc[:]) // the look after arming
		require.NoError(t, err)
		if !early {
			require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(uint64(round), x.mr, y.mr, 0, 8)}))
		}
		// An event may be a stale one, raised for a completion an earlier poll took (the
		// verbs contract allows it): then the consumer arms, looks and waits again.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a bound, not a timing
		for n == 0 {
			_, err := ych.Wait(ctx)
			require.NoError(t, err, "round %d (request before arming: %v): no event", round, early)
			if n, err = y.cq.Poll(wc[:]); err == nil && n == 0 {
				require.NoError(t, y.cq.ReqNotify(false))
				n, err = y.cq.Poll(wc[:])
			}
			require.NoError(t, err)
		}
		cancel()
		require.Equal(t, 1, n, "round %d: receive completions", round)
		require.Equal(t, verbs.WCSuccess, wc[0].Status)
		require.Equal(t, uint32(round), wc[0].Imm)
		require.Equal(t, verbs.WCSuccess, pollWait(t, x.cq, 1)[0].Status)
	}
}

// TestPollsStopWithoutArming: a CQ polled for a while, then neither polled nor armed,
// still has the requests to its QP executed: the connection's goroutine takes the ring
// back when its lease ends.
func TestPollsStopWithoutArming(t *testing.T) {
	p := newProvider(t, 2)
	x := newEnd(t, p, "shm0", 4096)
	y := newEnd(t, p, "shm1", 4096)
	connectEnds(t, x, y, 0, 7)
	// A first write maps y's region and starts the connection.
	require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(1, x.mr, y.mr, 0, 8)}))
	wr := &[]verbs.SendWR{writeImm(1, x.mr, y.mr, 0, 8)}[0]
	wr.Opcode = verbs.OpRDMAWrite
	require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, x.cq, 1)[0].Status)
	var wc [4]verbs.WorkCompletion
	for range 100 {
		_, err := y.cq.Poll(wc[:])
		require.NoError(t, err)
	}
	copy(x.mr.Bytes(), "no polls")
	require.NoError(t, x.qp.PostSend([]verbs.SendWR{*wr})) // y's CQ is never polled again
	require.Equal(t, verbs.WCSuccess, pollWait(t, x.cq, 1)[0].Status)
	require.Equal(t, "no polls", string(y.mr.Bytes()[:8]))
}

// TestPipelinedRNR: writes with immediate posted far ahead of the responder's receive
// WQEs run into RNR NAKs; the requester goes back to the first refused one and resends
// from there, so each executes exactly once and in order, and all succeed.
func TestPipelinedRNR(t *testing.T) {
	const n = 200
	p := newProvider(t, 2)
	x := newEnd(t, p, "shm0", 1<<16)
	y := newEnd(t, p, "shm1", 1<<16)
	connectEnds(t, x, y, 0, 7)
	require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{{ID: 0}, {ID: 1}, {ID: 2}, {ID: 3}}))
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		wrs[i] = writeImm(uint64(i), x.mr, y.mr, i*64%(1<<16), 64)
		wrs[i].Flags = 0 // unsignaled but the last: the responses need no doorbell
	}
	wrs[n-1].Flags = verbs.SendSignaled
	for i := range x.mr.Bytes() {
		x.mr.Bytes()[i] = byte(i * 13)
	}
	require.NoError(t, x.qp.PostSend(wrs[:n/2]))
	require.NoError(t, x.qp.PostSend(wrs[n/2:]))
	got := 0
	var wc [16]verbs.WorkCompletion
	deadline := time.Now().Add(20 * time.Second)
	for got < n {
		k, err := y.cq.Poll(wc[:])
		require.NoError(t, err)
		for _, c := range wc[:k] {
			require.Equal(t, verbs.WCSuccess, c.Status, "receive %d", got)
			require.Equal(t, uint32(got), c.Imm, "receive completions in order, each once")
			got++
			require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{{ID: uint64(got + 3)}}))
		}
		if k == 0 {
			require.False(t, time.Now().After(deadline), "waited 20 s for %d receives, got %d", n, got)
		}
	}
	wcs := pollWait(t, x.cq, 1)
	require.Equal(t, verbs.WCSuccess, wcs[0].Status)
	require.Equal(t, uint64(n-1), wcs[0].WRID)
	require.Equal(t, x.mr.Bytes()[:n*64], y.mr.Bytes()[:n*64], "the payloads")
}

// TestPipelinedSendsFillRing: SENDs large enough to fill the request ring (four fit),
// into a responder short of receive WQEs: the requester waits for room, resends from
// each RNR NAK, and every SEND lands once, in order.
func TestPipelinedSendsFillRing(t *testing.T) {
	const n, size = 24, 60 << 10
	p := newProvider(t, 2)
	x := newEnd(t, p, "shm0", n*size)
	y := newEnd(t, p, "shm1", n*size)
	connectEnds(t, x, y, 0, 7)
	recv := func(i int) verbs.RecvWR {
		return verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{{Addr: y.mr.Addr() + uint64(i*size), Length: size, LKey: y.mr.LKey()}}}
	}
	require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{recv(0)}))
	for i := range x.mr.Bytes() {
		x.mr.Bytes()[i] = byte(i*7 + i>>16)
	}
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: x.mr.Addr() + uint64(i*size), Length: size, LKey: x.mr.LKey()}}}
	}
	require.NoError(t, x.qp.PostSend(wrs))
	var wc [4]verbs.WorkCompletion
	deadline := time.Now().Add(20 * time.Second)
	for got := 0; got < n; {
		k, err := y.cq.Poll(wc[:])
		require.NoError(t, err)
		for _, c := range wc[:k] {
			require.Equal(t, verbs.WCSuccess, c.Status, "receive %d", got)
			require.Equal(t, uint64(got), c.WRID, "receives in order, each once")
			if got++; got < n {
				require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{recv(got)}))
			}
		}
		if k == 0 {
			require.False(t, time.Now().After(deadline), "waited 20 s for %d receives, got %d", n, got)
		}
	}
	for i, c := range pollWait(t, x.cq, n) {
		require.Equal(t, verbs.WCSuccess, c.Status, "send %d", i)
	}
	require.Equal(t, x.mr.Bytes(), y.mr.Bytes(), "the payloads")
}

// TestStallBehindUnsignaled: a requester whose next WR needs an empty pipeline (here a
// region query: the WRs alternate between two regions of the destination, and a QP
// keeps one mapped) behind an unsignaled WRITE in flight still completes it, with no
// Poll to drain the response ring: the plain acknowledgement of the unsignaled WRITE
// rings no doorbell, so the requester's reader must not sleep through it. The
// completion is awaited on the completion channel, as a poller that sleeps does.
// Before setStalled, the requester waited for that acknowledgement forever in most
// rounds (rsock: same-host streams with growing rings stopped, 64 connections at once).
func TestStallBehindUnsignaled(t *testing.T) {
	p := newProvider(t, 2)
	x, xch := newEventEnd(t, p, "shm0", 4096)
	y := newEnd(t, p, "shm1", 4096)
	other, err := y.pd.RegMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	defer other.Close()
	connectEnds(t, x, y, 0, 7)
	var wc [4]verbs.WorkCompletion
	for round := range 50 {
		first, second := verbs.MR(y.mr), other
		if round%2 == 1 {
			first, second = other, y.mr
		}
		plain := writeImm(uint64(2*round), x.mr, first, 0, 8)
		plain.Opcode, plain.Flags = verbs.OpRDMAWrite, 0
		signaled := writeImm(uint64(2*round+1), x.mr, second, 8, 8)
		signaled.Opcode = verbs.OpRDMAWrite
		require.NoError(t, x.cq.ReqNotify(false))
		require.NoError(t, x.qp.PostSend([]verbs.SendWR{plain, signaled}))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a bound, not a timing
		n := 0
		for n == 0 {
			if n, err = x.cq.Poll(wc[:]); err == nil && n == 0 {
				_, err = xch.Wait(ctx)
				require.NoError(t, err, "round %d: no completion", round)
				require.NoError(t, x.cq.ReqNotify(false))
				n, err = x.cq.Poll(wc[:])
			}
			require.NoError(t, err)
		}
		cancel()
		require.Equal(t, 1, n, "round %d", round)
		require.Equal(t, verbs.WCSuccess, wc[0].Status, "round %d", round)
		require.Equal(t, uint64(2*round+1), wc[0].WRID)
	}
}

// TestPollDrives: a CQ's Polls drive its rings while at most maxDriven QPs feed it, and
// it says so; fed by more, it says they do not, and a Poll still reaps what their
// goroutines execute.
func TestPollDrives(t *testing.T) {
	p := newProvider(t, 2)
	x := newEnd(t, p, "shm0", 4096)
	y := newEnd(t, p, "shm1", 4096)
	require.True(t, y.cq.(*CQ).PollDrives(), "no feeder yet")
	connectEnds(t, x, y, 0, 7)
	require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{{ID: 1}, {ID: 2}}))
	require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(1, x.mr, y.mr, 0, 8)}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, x.cq, 1)[0].Status)
	require.Equal(t, verbs.WCSuccess, pollWait(t, y.cq, 1)[0].Status)
	cq := y.cq.(*CQ)
	require.True(t, cq.PollDrives(), "one feeder")

	cq.feedMu.Lock()
	own := cq.feeders.Load()
	many := make([]*QP, maxDriven+1) // y's QP, counted maxDriven+1 times
	for i := range many {
		many[i] = (*own)[0]
	}
	cq.feeders.Store(&many)
	cq.feedMu.Unlock()
	require.False(t, cq.PollDrives(), "%d feeders", len(many))
	require.Nil(t, cq.feederList(), "Polls drive nothing")
	// The responder's goroutine executes the request (serve): the Poll reaps it.
	require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(2, x.mr, y.mr, 0, 8)}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, x.cq, 1)[0].Status)
	require.Equal(t, verbs.WCSuccess, pollWait(t, y.cq, 1)[0].Status)

	cq.feedMu.Lock()
	cq.feeders.Store(own)
	cq.feedMu.Unlock()
	require.True(t, cq.PollDrives())
}

// TestUnmapAwaitsPeeks: a ring that Polls look into without its lock (CQ.drive) is
// unmapped only once no Poll that reached it still looks: the connection's goroutine,
// ending, waits for the pass in flight (a read hold of the CQ's peekMu, taken here)
// with its channel still mapped, and unmaps it when the pass ends. Both sides: the
// responder's request ring (serve) and the requester's response ring (readLoop).
func TestUnmapAwaitsPeeks(t *testing.T) {
	for _, side := range []string{"responder", "requester"} {
		t.Run(side, func(t *testing.T) {
			x, y := connectedPair(t, newProvider(t, 2))

			// The side kept, its CQ held, and the socket that closes under it, as it
			// closes when the other side's process dies.
			kept, sock := y, x.qp.(*QP).out.Load().c
			if side == "requester" {
				kept, sock = x, y.qp.(*QP).in.Load().c
			}
			cq, maps := kept.cq.(*CQ), &kept.qp.(*QP).maps
			mapped := maps.liveCount()
			cq.peekMu.RLock() // a Poll's pass, in flight
			require.NoError(t, sock.Close())
			// The ending goroutine waits to take peekMu for writing, which keeps any
			// other reader out: wait for that, pacing the looks.
			deadline := time.Now().Add(20 * time.Second)
			for cq.peekMu.TryRLock() {
				cq.peekMu.RUnlock()
				require.False(t, time.Now().After(deadline), "no one waited for the pass to end")
				time.Sleep(50 * time.Microsecond)
			}
			require.Equal(t, mapped, maps.liveCount(), "unmapped under a pass in flight")
			cq.peekMu.RUnlock()
			for maps.liveCount() == mapped {
				require.False(t, time.Now().After(deadline), "the channel stayed mapped after the pass")
				time.Sleep(50 * time.Microsecond)
			}
		})
	}
}

// liveCount returns how many mappings are counted against m.
func (m *mapQuota) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live
}
