package rdma

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

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
	require.Equal(t, 2, f.Stats().PDs, "PDs after one endpoint is released")
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
			ca, cb := tcpPair(t)
			ea, err := Prepare(f, loopback, opts)
			require.NoError(t, err)
			eb, err := Prepare(f, loopback, Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: sendBuf})
			require.NoError(t, err)
			x, err := ea.Connect(eb.Offer(), ca, 0)
			require.NoError(t, err)
			y, err := eb.Connect(ea.Offer(), cb, 0)
			require.NoError(t, err)
			startPair(t, x, y)
			qps, bytes = b.held()
			require.Equal(t, 1, qps)
			require.Equal(t, ring+sendBuf, bytes)
			require.NoError(t, x.Close())
			require.NoError(t, y.Close())
			qps, bytes = b.held()
			require.Zero(t, qps+bytes, "held after Close")
			requireReleased(t, f)
		})
	}
}
