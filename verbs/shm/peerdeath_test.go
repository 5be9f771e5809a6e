package shm

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestPeerKilledMidTransfer: the peer process dies while this one streams RDMA writes
// with immediate into it. Every write acknowledged before is in the peer's memory; every
// WR posted gets exactly one completion, the successes first, then RETRY_EXC_ERR, then
// flushes; the QP ends in ERROR. No hang, no crash.
func TestPeerKilledMidTransfer(t *testing.T) {
	const size, chunk = 1 << 20, 16 << 10
	local := newProvider(t, 1)
	peer := startPeer(t)
	a := newEnd(t, local, "shm0", size)
	b := newEnd(t, peer.prov, "shm0", size)
	// No ACK timeout (0: wait forever, as hardware with timeout 0 does): a write is lost
	// only when the link is known dead, so a loaded machine that leaves the live peer
	// unscheduled for milliseconds cannot fail the first writes, and the peer's death
	// must be detected (its socket closes) for the test to end.
	connectEnds(t, a, b, 0, 3)
	// 48 receive WQEs: the 49th write waits in RNR retries (forever) until the peer dies,
	// so writes are outstanding when it does, however fast it is.
	recvs := make([]verbs.RecvWR, 48)
	for i := range recvs {
		recvs[i].ID = uint64(i)
	}
	require.NoError(t, b.qp.PostRecv(recvs))
	for i := range a.mr.Bytes() {
		a.mr.Bytes()[i] = byte(i*7 + i>>8)
	}

	// 32 writes, acknowledged: they are in the peer's memory.
	wrs := make([]verbs.SendWR, 32)
	for i := range wrs {
		wrs[i] = writeImm(uint64(i), a.mr, b.mr, i*chunk, chunk)
	}
	require.NoError(t, a.qp.PostSend(wrs))
	for i, wc := range pollWait(t, a.cq, len(wrs)) {
		require.Equal(t, verbs.WCSuccess, wc.Status, "write %d", i)
	}
	got, err := b.mr.(interface {
		ReadAt(int, int) ([]byte, error)
	}).ReadAt(0, 32*chunk)
	require.NoError(t, err)
	require.True(t, bytes.Equal(a.mr.Bytes()[:32*chunk], got), "acknowledged writes missing from the peer's region")

	// 64 more, and the peer dies while they are on their way: 16 can land.
	wrs = make([]verbs.SendWR, 64)
	for i := range wrs {
		wrs[i] = writeImm(uint64(100+i), a.mr, b.mr, (32+i)*chunk%size, chunk)
	}
	require.NoError(t, a.qp.PostSend(wrs))
	require.NoError(t, peer.cmd.Process.Kill())
	peer.cmd.Wait()
	wcs := pollWait(t, a.cq, len(wrs))
	k := 0
	for k < len(wcs) && wcs[k].Status == verbs.WCSuccess {
		k++
	}
	require.LessOrEqual(t, k, 16, "writes succeeded beyond the peer's receive WQEs")
	require.Equal(t, verbs.WCRetryExcErr, wcs[k].Status, "the first write the dead peer did not acknowledge (after %d)", k)
	for i, wc := range wcs {
		require.Equal(t, uint64(100+i), wc.WRID, "completions in order")
		if i > k {
			require.Equal(t, verbs.WCWRFlushErr, wc.Status, "write %d behind the failed one", i)
		}
	}
	require.Equal(t, verbs.QPStateError, a.qp.State())

	// Posting more is flushed, not hung.
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(999, a.mr, b.mr, 0, 8)}))
	wc := pollWait(t, a.cq, 1)[0]
	require.Equal(t, verbs.WCWRFlushErr, wc.Status)
	require.Equal(t, uint64(999), wc.WRID)
}
