package soft_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestPathUnreachable: requests between two GIDs whose path is unreachable are lost both
// ways (the requester runs out of retries), while the QPs stay in RTS until then, and
// another pair of GIDs on the same devices is untouched; a restored path carries again.
func TestPathUnreachable(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 3, TimeScale: 0.01})
	a, b := connectPair(t, f, pairOpts{devA: "soft0", devB: "soft1", retry: 2})
	c, d := connectPair(t, f, pairOpts{devA: "soft0", devB: "soft2"})
	require.NoError(t, f.SetPath(b.gid, a.gid, soft.Path{Unreachable: true}))
	require.Equal(t, verbs.QPStateRTS, a.qp.State(), "a filtered path does not keep a QP from RTS")

	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))
	require.NoError(t, d.qp.PostRecv([]verbs.RecvWR{{ID: 2}}))
	require.NoError(t, c.qp.PostSend([]verbs.SendWR{writeImm(2, c.mr, d.mr, 0, 8)}))
	require.Equal(t, verbs.WCSuccess, poll(t, c.scq, 1)[0].Status, "soft0-soft2 while soft0-soft1 is filtered")
	require.Equal(t, verbs.WCRetryExcErr, poll(t, a.scq, 1)[0].Status, "a→b over the filtered path")
	require.Equal(t, verbs.QPStateError, a.qp.State())
	requireEmpty(t, b.rcq)

	// The other direction, on a fresh pair: restored, the path carries.
	e, g := connectPair(t, f, pairOpts{devA: "soft0", devB: "soft1", retry: 7, timeout: 19})
	require.NoError(t, e.qp.PostRecv([]verbs.RecvWR{{ID: 3}}))
	require.NoError(t, g.qp.PostSend([]verbs.SendWR{writeImm(3, g.mr, e.mr, 0, 8)}))
	requireEmpty(t, e.rcq)
	require.NoError(t, f.SetPath(a.gid, b.gid, soft.Path{}))
	require.Equal(t, verbs.WCSuccess, poll(t, g.scq, 1)[0].Status, "g→e once the path is restored")
	require.Equal(t, verbs.WCSuccess, poll(t, e.rcq, 1)[0].Status)
}

// TestPathLossy: a path that loses every other request still delivers every message,
// in order, through retransmissions, which the fabric counts.
func TestPathLossy(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2, TimeScale: 0.01})
	a, b := connectPair(t, f, pairOpts{retry: 7})
	require.NoError(t, f.SetPath(a.gid, b.gid, soft.Path{DropEvery: 2}))
	const n = 8
	for i := range n {
		require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
	}
	for i := range n {
		require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(uint64(i), a.mr, b.mr, 8*i, 8)}))
	}
	for i, wc := range poll(t, b.rcq, n) {
		require.Equal(t, verbs.WCSuccess, wc.Status)
		require.Equal(t, uint64(i), wc.WRID, "arrival %d in order", i)
	}
	for _, wc := range poll(t, a.scq, n) {
		require.Equal(t, verbs.WCSuccess, wc.Status)
	}
	require.GreaterOrEqual(t, f.Stats().Retries, uint64(n/2), "retransmissions across the lossy path")
}

func TestPathArguments(t *testing.T) {
	f := newFabric(t, soft.Options{})
	require.ErrorIs(t, f.SetPath(verbs.GID{}, verbs.GID{1}, soft.Path{DropEvery: -1}), verbs.ErrInvalidArgument)
	require.NoError(t, f.SetPath(verbs.GID{}, verbs.GID{1}, soft.Path{}), "clearing a path never set")
}
