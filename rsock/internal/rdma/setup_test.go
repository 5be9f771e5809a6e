package rdma

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestProtectionDomainPerConnection: each endpoint gets a protection domain of its own,
// released with it, while the device context and CQs stay shared.
func TestProtectionDomainPerConnection(t *testing.T) {
	f := soft.New(soft.Options{})
	var eps []*Endpoint
	for range 3 {
		ep, err := Prepare(f, loopback, Options{})
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	s := f.Stats()
	require.Equal(t, 3, s.PDs, "PDs of three endpoints: %+v", s)
	require.Equal(t, 1, s.Contexts, "contexts of three endpoints: %+v", s)
	require.NotSame(t, eps[0].pd, eps[1].pd)
	require.Same(t, eps[0].dev, eps[1].dev)
	require.NoError(t, eps[0].Abort())
	s = f.Stats()
	// The released endpoint's PD stays, without a QP, in the device's pool (pool.go).
	require.Equal(t, 2, s.QPs, "QPs after one endpoint is released: %+v", s)
	require.Equal(t, 3, s.PDs, "PDs after one endpoint is released, one pooled: %+v", s)
	for _, ep := range eps[1:] {
		require.NoError(t, ep.Abort())
	}
	requireReleased(t, f)
}

// budget is a Budget with limits, recording what it holds.
type budget struct {
	mu               sync.Mutex
	maxQPs, maxBytes int
	qps, bytes       int
}

var errOverBudget = errors.New("over budget")

func (b *budget) Charge(qps, bytes int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.qps+qps > b.maxQPs || b.bytes+bytes > b.maxBytes {
		return fmt.Errorf("%w: %d+%d queue pairs, %d+%d bytes", errOverBudget, b.qps, qps, b.bytes, bytes)
	}
	b.qps += qps
	b.bytes += bytes
	return nil
}

func (b *budget) Refund(qps, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.qps -= qps
	b.bytes -= bytes
}

func (b *budget) held() (qps, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.qps, b.bytes
}

// TestBudget charges an endpoint's queue pair and registrations to Options.Budget: a
// refusal at each step fails Prepare with the budget's error and leaves nothing
// allocated or charged; a granted endpoint holds its QP and every registered byte until
// it is released, by Abort or by its Conn's Close.
func TestBudget(t *testing.T) {
	// A fixed ring, registered with its mailbox, and a send buffer.
	const ring, sendBuf = 16<<10 + mailboxSize, 8 << 10
	tests := []struct {
		name             string
		maxQPs, maxBytes int
		refusedAt        string // "" when granted
	}{
		{"granted", 1, ring + sendBuf, ""},
		{"no queue pair", 0, ring + sendBuf, "queue pair"},
		{"no room for the ring", 1, ring - 1, "receive ring"},
		{"no room for the send buffer", 1, ring + sendBuf - 1, "send buffer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			b := &budget{maxQPs: tt.maxQPs, maxBytes: tt.maxBytes}
			opts := Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: sendBuf, Budget: b}
			ep, err := Prepare(f, loopback, opts)
			if tt.refusedAt != "" {
				require.ErrorIs(t, err, errOverBudget)
				require.ErrorContains(t, err, tt.refusedAt)
				qps, bytes := b.held()
				require.Zero(t, qps, "queue pairs held after a refusal")
				require.Zero(t, bytes, "bytes held after a refusal")
				requireReleased(t, f)
				return
			}
			require.NoError(t, err)
			qps, bytes := b.held()
			require.Equal(t, 1, qps, "queue pairs held by an endpoint")
			require.Equal(t, ring+sendBuf, bytes, "bytes held by an endpoint")
			require.NoError(t, ep.Abort())
			qps, bytes = b.held()
			require.Zero(t, qps+bytes, "held after Abort")

			// Through a connection's life: charged until Close.
			ea, err := Prepare(f, loopback, opts)
			require.NoError(t, err)
			requireHeldUntilClose(t, f, b, ea, Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: sendBuf}, ring+sendBuf)
		})
	}
}

// requireHeldUntilClose connects ep to an endpoint prepared with peerOpts and checks
// that b holds ep's queue pair and bytes registered bytes while they are connected,
// and nothing once both Conns are closed.
func requireHeldUntilClose(t *testing.T, f *soft.Fabric, b *budget, ep *Endpoint, peerOpts Options, bytes int) {
	t.Helper()
	ca, cb := tcpPair(t)
	peer, err := Prepare(f, loopback, peerOpts)
	require.NoError(t, err)
	x, err := ep.Connect(peer.Offer(), ca, 0)
	require.NoError(t, err)
	y, err := peer.Connect(ep.Offer(), cb, 0)
	require.NoError(t, err)
	startPair(t, x, y)
	qps, held := b.held()
	require.Equal(t, 1, qps, "queue pairs held while connected")
	require.Equal(t, bytes, held, "bytes held while connected")
	require.NoError(t, x.Close())
	require.NoError(t, y.Close())
	qps, held = b.held()
	require.Zero(t, qps+held, "held after Close")
	requireReleased(t, f)
}

// TestAdoptBudget prepares endpoints without a budget and has them adopt one: the
// budget is charged for what the endpoint holds (its QP, ring and send buffer), or
// refuses and holds nothing; an adopted endpoint charges and refunds it as if prepared
// with it, through its Conn's life.
func TestAdoptBudget(t *testing.T) {
	const ring, sendBuf = 16<<10 + mailboxSize, 8 << 10
	opts := Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: sendBuf}
	tests := []struct {
		name             string
		maxQPs, maxBytes int
		wantRefused      bool
	}{
		{"room", 1, ring + sendBuf, false},
		{"no queue pair", 0, ring + sendBuf, true},
		{"no room for the buffers", 1, ring + sendBuf - 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			b := &budget{maxQPs: tt.maxQPs, maxBytes: tt.maxBytes}
			ep, err := Prepare(f, loopback, opts)
			require.NoError(t, err)
			err = ep.AdoptBudget(b)
			if tt.wantRefused {
				require.ErrorIs(t, err, errOverBudget)
				qps, bytes := b.held()
				require.Zero(t, qps+bytes, "held after a refusal")
				require.NoError(t, ep.AdoptBudget(&budget{maxQPs: 1, maxBytes: ring + sendBuf}), "a refusal leaves the endpoint free to adopt another")
				require.NoError(t, ep.Abort())
				requireReleased(t, f)
				return
			}
			require.NoError(t, err)
			qps, bytes := b.held()
			require.Equal(t, 1, qps, "queue pairs adopted")
			require.Equal(t, ring+sendBuf, bytes, "bytes adopted")
			require.Error(t, ep.AdoptBudget(b), "a second budget")
			require.Error(t, ep.AdoptBudget(nil), "a second budget, even none")
			requireHeldUntilClose(t, f, b, ep, opts, ring+sendBuf)
		})
	}
}

// TestPrepareFailsCleanly fails each step of Prepare on a fake provider in turn: Prepare
// returns that step's error, with what it was doing, and leaves nothing allocated,
// admitted or charged to the budget; the next Prepare, with the fault gone, succeeds.
func TestPrepareFailsCleanly(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		step     string
		wantText string
	}{
		{"devices", "list devices"},
		{"open", "open device fake0"},
		{"chan", "create completion channel"},
		{"cq", "create CQ"},
		{"pd", "allocate protection domain on fake0"},
		{"mr", "receive ring"},
		{"qp", "create QP"},
		{"init", "QP to INIT"},
		{"recv", "post the proof WQE"},
	}
	for _, tt := range tests {
		t.Run(tt.step, func(t *testing.T) {
			p := newFakeProvider()
			b := &budget{maxQPs: 1, maxBytes: 1 << 30}
			p.failAt(tt.step, boom)
			_, err := Prepare(p, loopback, Options{Budget: b})
			require.ErrorIs(t, err, boom)
			require.ErrorContains(t, err, tt.wantText)
			qps, bytes := b.held()
			require.Zero(t, qps+bytes, "charged to the budget after a failure at %s", tt.step)
			requireFakeReleased(t, p)

			p.failAt(tt.step, nil)
			ep, err := Prepare(p, loopback, Options{Budget: b})
			require.NoError(t, err, "Prepare after the fault at %s went", tt.step)
			require.Equal(t, 1, ep.dev.conns, "endpoints admitted on the device")
			require.NoError(t, ep.Abort())
			requireFakeReleased(t, p)
		})
	}
}

// TestPrepareNamesTheFailedWQE: the receive WQEs go out in batches, and a post that
// fails partway names the WQE that failed, whichever batch it was in.
func TestPrepareNamesTheFailedWQE(t *testing.T) {
	for _, tt := range []struct {
		room int // receive WQEs the QP takes
		want string
	}{
		{room: 1, want: "post receive WQE 0: "},               // the proof WQE went in
		{room: setupBatch, want: "post receive WQE 15: "},     // the first batch's last
		{room: setupBatch + 3, want: "post receive WQE 18: "}, // in the second batch
		{room: 64, want: "post receive WQE 63: "},             // the last of 64
	} {
		p := newFakeProvider()
		p.recvRoom = tt.room
		_, err := Prepare(p, loopback, Options{RecvWQEs: 64, GrowRecvWQEsTo: -1})
		require.ErrorIs(t, err, verbs.ErrQueueFull, "room for %d", tt.room)
		require.ErrorContains(t, err, tt.want, "room for %d", tt.room)
		requireFakeReleased(t, p)
	}
	p := newFakeProvider()
	p.recvRoom = 65
	ep, err := Prepare(p, loopback, Options{RecvWQEs: 64, GrowRecvWQEsTo: -1})
	require.NoError(t, err, "room for the proof WQE and 64")
	require.Equal(t, 65, ep.qp.(*fakeVerbsQP).recvs)
	require.NoError(t, ep.Abort())
	requireFakeReleased(t, p)
}

// TestPrepareOnFakeProvider: each endpoint gets a protection domain, ring, send buffer
// and QP of its own, on one shared device context and CQ; its QP is in INIT with the
// proof WQE and every receive WQE posted; its offer describes its ring and QP; Abort
// releases all of it but the device, which stays warm.
func TestPrepareOnFakeProvider(t *testing.T) {
	p := newFakeProvider()
	opts := Options{RingSize: 16 << 10, GrowRingTo: -1, RecvWQEs: 32}
	var eps []*Endpoint
	for range 2 {
		ep, err := Prepare(p, loopback, opts)
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	live, listings, opens := p.counts()
	require.Equal(t, fakeCounts{Contexts: 1, PDs: 2, MRs: 4, QPs: 2, CQs: 1, Chans: 1}, live)
	require.Equal(t, 1, listings, "device listings")
	require.Equal(t, 1, opens, "device openings")
	for i, ep := range eps {
		qp := ep.qp.(*fakeVerbsQP)
		require.Equal(t, verbs.QPStateInit, qp.State(), "endpoint %d", i)
		require.Equal(t, 1+32, qp.recvs, "endpoint %d: receive WQEs posted, the proof WQE's included", i)
		o := ep.Offer()
		require.Equal(t, qp.qpn, o.QPN, "endpoint %d", i)
		require.Equal(t, ep.ring.Addr(), o.RingAddr, "endpoint %d", i)
		require.Equal(t, uint32(16<<10), o.RingSize, "endpoint %d", i)
		require.Equal(t, uint32(32), o.RecvWQEs, "endpoint %d", i)
		require.Equal(t, verbs.MTU1024, o.MTU, "endpoint %d", i)
		require.Equal(t, verbs.GIDFromAddr(loopback), o.GID, "endpoint %d", i)
	}
	require.NotSame(t, eps[0].pd, eps[1].pd)
	require.Same(t, eps[0].dev, eps[1].dev)
	require.Same(t, eps[0].poller, eps[1].poller)
	require.NoError(t, eps[0].Abort())
	live, _, _ = p.counts()
	require.Equal(t, fakeCounts{Contexts: 1, PDs: 1, MRs: 2, QPs: 1, CQs: 1, Chans: 1}, live, "after one Abort")
	require.NoError(t, eps[1].Abort())
	live, _, _ = p.counts()
	require.Equal(t, fakeCounts{Contexts: 1, CQs: 1, Chans: 1}, live, "warm: the device and one CQ")
	requireFakeReleased(t, p)
}

// TestACKTimeout: the QP goes to RTS with the engine's ACK timeout and retries, or with
// no timeout (0: wait for ever) when Options.NoACKTimeout says so.
func TestACKTimeout(t *testing.T) {
	for _, tt := range []struct {
		name        string
		noTimeout   bool
		wantTimeout uint8
	}{
		{"default", false, ackTimeout},
		{"none", true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeProvider()
			ep, err := Prepare(p, loopback, Options{NoACKTimeout: tt.noTimeout})
			require.NoError(t, err)
			require.NoError(t, ep.connectQP(ep.Offer()))
			q := ep.qp.(*fakeVerbsQP)
			q.mu.Lock()
			rts := q.rts
			q.mu.Unlock()
			require.Equal(t, tt.wantTimeout, rts.Timeout, "RTS timeout")
			require.Equal(t, uint8(ackRetries), rts.RetryCount, "RTS retry count")
			require.NoError(t, ep.Abort())
			requireFakeReleased(t, p)
		})
	}
}
