package rc

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

var testProvider = NewProvider("test")

// testCQ stands for a provider's CQ: what Channel.Wait returns.
type testCQ struct{ core CQ }

func (c *testCQ) Poll(wc []verbs.WorkCompletion) (int, error) { return c.core.Poll(wc) }
func (c *testCQ) ReqNotify(solicitedOnly bool) error          { return c.core.ReqNotify(solicitedOnly) }
func (c *testCQ) Close() error                                { return c.core.Close() }

func newTestCQ(t *testing.T, capacity int, ch *Channel) *testCQ {
	t.Helper()
	if ch != nil {
		require.NoError(t, ch.Attach())
	}
	c := &testCQ{}
	c.core.Init(testProvider, c, capacity, ch)
	return c
}

func newTestChannel() *Channel {
	ch := new(Channel)
	ch.Init(testProvider)
	return ch
}

// push is one completion a test pushes: of which QP (an index into the test's Slots),
// releasing how many slots.
type push struct {
	qp         int
	wrID       uint64
	send, recv uint32
}

func TestCQPollReleasesSlots(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		skip     int // completions pushed and polled first, so that the ring wraps
		pushes   []push
		polls    []int    // len(wc) of each Poll
		wantIDs  []uint64 // WRIDs polled, in order
		wantSQ   []uint64 // slots released per QP after the polls
		wantRQ   []uint64
	}{
		{
			name:     "one send, one receive",
			capacity: 4,
			pushes:   []push{{0, 1, 3, 0}, {0, 2, 0, 1}},
			polls:    []int{4},
			wantIDs:  []uint64{1, 2},
			wantSQ:   []uint64{3},
			wantRQ:   []uint64{1},
		},
		{
			name:     "unpolled completions hold their slots",
			capacity: 4,
			pushes:   []push{{0, 1, 1, 0}, {1, 2, 2, 0}, {0, 3, 0, 1}},
			polls:    []int{1},
			wantIDs:  []uint64{1},
			wantSQ:   []uint64{1, 0},
			wantRQ:   []uint64{0, 0},
		},
		{
			name:     "ring wraps",
			capacity: 3,
			skip:     2,
			pushes:   []push{{0, 1, 1, 0}, {0, 2, 1, 0}, {0, 3, 0, 2}},
			polls:    []int{2, 0, 2},
			wantIDs:  []uint64{1, 2, 3},
			wantSQ:   []uint64{2},
			wantRQ:   []uint64{2},
		},
		{
			name:     "empty",
			capacity: 1,
			polls:    []int{1},
			wantSQ:   []uint64{0},
			wantRQ:   []uint64{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCQ(t, tt.capacity, nil)
			require.Equal(t, tt.capacity, c.core.Capacity())
			var skipped Slots
			for range tt.skip {
				var wc verbs.WorkCompletion
				require.True(t, c.core.Push(&wc, &skipped, 1, 0, false))
			}
			n, err := c.core.Poll(make([]verbs.WorkCompletion, tt.skip))
			require.NoError(t, err)
			require.Equal(t, tt.skip, n, "completions polled first")

			qps := make([]Slots, len(tt.wantSQ))
			for _, p := range tt.pushes {
				wc := verbs.WorkCompletion{WRID: p.wrID}
				require.True(t, c.core.Push(&wc, &qps[p.qp], p.send, p.recv, false), "Push(%+v)", p)
			}
			var got []uint64
			for _, n := range tt.polls {
				wc := make([]verbs.WorkCompletion, n)
				k, err := c.core.Poll(wc)
				require.NoError(t, err)
				for _, w := range wc[:k] {
					got = append(got, w.WRID)
				}
			}
			require.Equal(t, tt.wantIDs, got, "WRIDs polled")
			for i := range qps {
				require.Equal(t, tt.wantSQ[i], qps[i].SQ.Load(), "send slots released of QP %d", i)
				require.Equal(t, tt.wantRQ[i], qps[i].RQ.Load(), "receive slots released of QP %d", i)
			}
		})
	}
}

func TestCQOverflow(t *testing.T) {
	c := newTestCQ(t, 2, nil)
	var s Slots
	wc := verbs.WorkCompletion{}
	require.True(t, c.core.Push(&wc, &s, 1, 0, false))
	require.True(t, c.core.Push(&wc, &s, 1, 0, false))
	require.False(t, c.core.Push(&wc, &s, 1, 0, false), "Push into a full CQ")
	require.False(t, c.core.Push(&wc, &s, 1, 0, false), "Push into an overflowed CQ")
	_, err := c.core.Poll(make([]verbs.WorkCompletion, 4))
	require.ErrorIs(t, err, verbs.ErrCQOverflow)
	require.ErrorIs(t, c.core.ReqNotify(false), verbs.ErrCQOverflow)
	require.Zero(t, s.SQ.Load(), "an overflowed CQ releases no slots")
}

func TestCQForget(t *testing.T) {
	tests := []struct {
		name    string
		qps     []int // QP of each completion pushed; its WRID is its index
		forget  int
		wantIDs []uint64
	}{
		{"none of it", []int{0, 0}, 1, []uint64{0, 1}},
		{"all of it", []int{1, 1}, 1, nil},
		{"interleaved", []int{0, 1, 0, 1, 0}, 1, []uint64{0, 2, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCQ(t, len(tt.qps), nil)
			qps := make([]Slots, 2)
			// Push and poll one first, so that the ring's live part wraps.
			var wc verbs.WorkCompletion
			require.True(t, c.core.Push(&wc, &qps[0], 0, 0, false))
			n, err := c.core.Poll(make([]verbs.WorkCompletion, 1))
			require.NoError(t, err)
			require.Equal(t, 1, n)
			for i, qp := range tt.qps {
				wc := verbs.WorkCompletion{WRID: uint64(i)}
				require.True(t, c.core.Push(&wc, &qps[qp], 1, 0, false))
			}
			c.core.Forget(&qps[tt.forget])
			out := make([]verbs.WorkCompletion, 8)
			n, err = c.core.Poll(out)
			require.NoError(t, err)
			var got []uint64
			for _, w := range out[:n] {
				got = append(got, w.WRID)
			}
			require.Equal(t, tt.wantIDs, got, "WRIDs polled after forgetting QP %d of %v", tt.forget, tt.qps)
			require.Zero(t, qps[tt.forget].SQ.Load(), "forgotten completions release no slots")
		})
	}
}

func TestCQClose(t *testing.T) {
	c := newTestCQ(t, 1, nil)
	require.NoError(t, c.core.Use())
	require.ErrorIs(t, c.core.Close(), verbs.ErrBusy, "Close of a CQ in use")
	c.core.Unuse()
	require.NoError(t, c.core.Close())
	require.ErrorIs(t, c.core.Close(), verbs.ErrClosed, "second Close")
	require.ErrorIs(t, c.core.Use(), verbs.ErrClosed, "Use after Close")
	_, err := c.core.Poll(make([]verbs.WorkCompletion, 1))
	require.ErrorIs(t, err, verbs.ErrClosed, "Poll after Close")
	require.ErrorIs(t, c.core.ReqNotify(false), verbs.ErrClosed, "ReqNotify after Close")
	var wc verbs.WorkCompletion
	require.False(t, c.core.Push(&wc, new(Slots), 1, 0, false), "Push after Close")
}

func TestCQNotify(t *testing.T) {
	tests := []struct {
		name          string
		arm           bool
		solicitedOnly bool
		solicited     bool
		status        verbs.WCStatus
		wantEvent     bool
	}{
		{"not armed", false, false, false, verbs.WCSuccess, false},
		{"armed", true, false, false, verbs.WCSuccess, true},
		{"solicited only, unsolicited", true, true, false, verbs.WCSuccess, false},
		{"solicited only, solicited", true, true, true, verbs.WCSuccess, true},
		{"solicited only, failed", true, true, false, verbs.WCWRFlushErr, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := newTestChannel()
			c := newTestCQ(t, 4, ch)
			if tt.arm {
				require.NoError(t, c.core.ReqNotify(tt.solicitedOnly))
			}
			require.Equal(t, tt.arm, c.core.Armed(), "Armed after arming")
			wc := verbs.WorkCompletion{Status: tt.status}
			require.True(t, c.core.Push(&wc, new(Slots), 0, 1, tt.solicited))
			require.Equal(t, tt.arm && !tt.wantEvent, c.core.Armed(), "Armed after a completion")
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // Wait returns what is pending, else ctx.Err() at once
			got, err := ch.Wait(ctx)
			if !tt.wantEvent {
				require.ErrorIs(t, err, context.Canceled)
				return
			}
			require.NoError(t, err)
			require.Same(t, c, got.(*testCQ))
			// One event per arming: a second completion raises none.
			require.True(t, c.core.Push(&wc, new(Slots), 0, 1, true))
			_, err = ch.Wait(ctx)
			require.ErrorIs(t, err, context.Canceled, "event without re-arming")
		})
	}
}

func TestChannelCoalescesAndDrops(t *testing.T) {
	ch := newTestChannel()
	a, b := newTestCQ(t, 4, ch), newTestCQ(t, 4, ch)
	var wc verbs.WorkCompletion
	// a triggers twice (re-armed between, its event not yet taken), then b once.
	require.NoError(t, a.core.ReqNotify(false))
	require.True(t, a.core.Push(&wc, new(Slots), 0, 0, false))
	require.NoError(t, a.core.ReqNotify(false))
	require.True(t, a.core.Push(&wc, new(Slots), 0, 0, false))
	require.NoError(t, b.core.ReqNotify(false))
	require.True(t, b.core.Push(&wc, new(Slots), 0, 0, false))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got, err := ch.Wait(ctx)
	require.NoError(t, err)
	require.Same(t, a, got.(*testCQ), "first event")
	got, err = ch.Wait(ctx)
	require.NoError(t, err)
	require.Same(t, b, got.(*testCQ), "second event")
	_, err = ch.Wait(ctx)
	require.ErrorIs(t, err, context.Canceled, "a's two triggers are one event")

	// Closing a CQ discards its pending event and detaches it.
	require.NoError(t, a.core.ReqNotify(false))
	require.True(t, a.core.Push(&wc, new(Slots), 0, 0, false))
	require.ErrorIs(t, ch.Close(), verbs.ErrBusy, "Close with CQs attached")
	require.NoError(t, a.core.Close())
	_, err = ch.Wait(ctx)
	require.ErrorIs(t, err, context.Canceled, "event of a closed CQ")
	require.NoError(t, b.core.Close())
	require.NoError(t, ch.Close())
	_, err = ch.Wait(ctx)
	require.ErrorIs(t, err, verbs.ErrClosed, "Wait on a closed channel")
	require.ErrorIs(t, ch.Attach(), verbs.ErrClosed, "Attach to a closed channel")
}

func TestChannelWaitWakes(t *testing.T) {
	tests := []struct {
		name string
		wake func(ch *Channel, c *testCQ)
		want error // nil: Wait returns c
	}{
		{"completion", func(_ *Channel, c *testCQ) {
			var wc verbs.WorkCompletion
			c.core.Push(&wc, new(Slots), 0, 0, false)
		}, nil},
		{"close", func(ch *Channel, c *testCQ) {
			c.core.Close()
			ch.Close()
		}, verbs.ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ch := newTestChannel()
				c := newTestCQ(t, 4, ch)
				require.NoError(t, c.core.ReqNotify(false))
				type result struct {
					cq  verbs.CQ
					err error
				}
				done := make(chan result, 1)
				go func() {
					cq, err := ch.Wait(context.Background())
					done <- result{cq, err}
				}()
				synctest.Wait() // Wait is parked
				tt.wake(ch, c)
				r := <-done
				if tt.want != nil {
					require.ErrorIs(t, r.err, tt.want)
					return
				}
				require.NoError(t, r.err)
				require.Same(t, c, r.cq.(*testCQ))
				require.NoError(t, c.core.Close())
				require.NoError(t, ch.Close())
			})
		})
	}
}

func TestCQPushPollAllocs(t *testing.T) {
	ch := newTestChannel()
	c := newTestCQ(t, 16, ch)
	var s Slots
	wc := verbs.WorkCompletion{WRID: 1}
	out := make([]verbs.WorkCompletion, 16)
	allocs := testing.AllocsPerRun(100, func() {
		c.core.ReqNotify(false)
		for range 8 {
			c.core.Push(&wc, &s, 1, 0, false)
		}
		c.core.Poll(out)
		ch.Wait(canceled)
	})
	require.Zero(t, allocs, "allocations per arm, 8 pushes, a poll and a wait")
}

// TestCQPending checks pending, the lock-free look with which an empty Poll returns: it
// must be set whenever a Poll would find something, a completion or the error of a
// closed or overflowed CQ, or that Poll would wrongly report an empty CQ.
func TestCQPending(t *testing.T) {
	type op int
	const (
		push op = iota
		pollOne
		forget
		closeCQ
	)
	tests := []struct {
		name     string
		capacity int
		ops      []op
		want     []bool // pending after each op
	}{
		{"push then drain", 2, []op{push, push, pollOne, pollOne}, []bool{true, true, true, false}},
		{"forget the only completion", 2, []op{push, forget}, []bool{true, false}},
		{"overflow stays pending after polls", 1, []op{push, push, pollOne}, []bool{true, true, true}},
		{"close of an empty CQ", 1, []op{closeCQ}, []bool{true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCQ(t, tt.capacity, nil)
			require.False(t, c.core.pending.Load(), "a new CQ")
			var s Slots
			var wc verbs.WorkCompletion
			for i, o := range tt.ops {
				switch o {
				case push:
					c.core.Push(&wc, &s, 1, 0, false)
				case pollOne:
					c.core.Poll(make([]verbs.WorkCompletion, 1))
				case forget:
					c.core.Forget(&s)
				case closeCQ:
					require.NoError(t, c.core.Close())
				}
				require.Equal(t, tt.want[i], c.core.pending.Load(), "after op %d of %v", i, tt.ops)
			}
			// Whatever pending said last, a Poll agrees with it.
			n, err := c.core.Poll(make([]verbs.WorkCompletion, 4))
			require.Equal(t, tt.want[len(tt.want)-1], n > 0 || err != nil, "Poll after the ops: %d completions, %v", n, err)
		})
	}
}

var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// BenchmarkCQPollEmpty is the empty poll of consumers that spin on one CQ (rsock's
// waiting Reads and Writes, one per processor): a look that takes no lock.
func BenchmarkCQPollEmpty(b *testing.B) {
	c := &testCQ{}
	c.core.Init(testProvider, c, 64, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]verbs.WorkCompletion, 16)
		for pb.Next() {
			c.core.Poll(out)
		}
	})
}

func BenchmarkCQPushPoll(b *testing.B) {
	c := &testCQ{}
	c.core.Init(testProvider, c, 64, nil)
	var s Slots
	wc := verbs.WorkCompletion{WRID: 1}
	out := make([]verbs.WorkCompletion, 16)
	b.ReportAllocs()
	for b.Loop() {
		for range 16 {
			c.core.Push(&wc, &s, 1, 0, false)
		}
		c.core.Poll(out)
	}
}
