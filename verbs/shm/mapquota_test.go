package shm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/verbs"
)

// TestMapQuota follows the process's count of mappings through a QP's life: the
// reservation counts qpMappings at once, mappings within it count nothing more, those
// beyond it count one each and may be refused, and closing the QP leaves counted only
// the mappings still made.
func TestMapQuota(t *testing.T) {
	defer vma.SetBudget(vma.Held() + qpMappings + 1)()
	base := vma.Held()
	counted := func() int64 { return vma.Held() - base }

	var q mapQuota
	require.NoError(t, q.open())
	require.EqualValues(t, qpMappings, counted(), "reserved")
	for range qpMappings {
		require.NoError(t, q.take())
	}
	require.EqualValues(t, qpMappings, counted(), "within the reservation")
	require.NoError(t, q.take())
	require.EqualValues(t, qpMappings+1, counted(), "one beyond it")
	err := q.take()
	require.ErrorIs(t, err, verbs.ErrNoResources, "the process's share is full")
	require.ErrorContains(t, err, "vm.max_map_count")
	require.EqualValues(t, qpMappings+1, counted(), "a refused take counts nothing")

	q.give()
	require.EqualValues(t, qpMappings, counted(), "the one beyond given back")
	for range qpMappings - 2 {
		q.give()
	}
	require.EqualValues(t, qpMappings, counted(), "within the reservation: still reserved")

	// Two mappings outlive the QP (channels its connections' goroutines unmap last).
	q.close()
	require.EqualValues(t, 2, counted(), "closed: the reservation goes, the live mappings stay counted")
	q.give()
	q.give()
	require.Zero(t, counted())
}

// TestMapQuotaRefused: a QP whose reservation does not fit is not made.
func TestMapQuotaRefused(t *testing.T) {
	defer vma.SetBudget(vma.Held() + qpMappings - 1)()
	base := vma.Held()
	p := newProvider(t, 1)
	ctx, err := p.Open("shm0")
	require.NoError(t, err)
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	cq, err := ctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	defer cq.Close()
	_, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Caps: verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.ErrorIs(t, err, verbs.ErrNoResources)
	require.ErrorContains(t, err, "vm.max_map_count")
	require.Equal(t, base, vma.Held())
}
