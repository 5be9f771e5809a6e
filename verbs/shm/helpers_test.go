package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
)

// end is one side of a test connection: a QP with its context, PD, CQ and one region.
type end struct {
	ctx verbs.Context
	pd  verbs.PD
	cq  verbs.CQ
	mr  verbs.MR
	qp  verbs.QP
	gid verbs.GID
}

// newEnd opens device dev of p and creates an end whose QP is in RESET; everything is
// destroyed when the test ends.
func newEnd(t testing.TB, p verbs.Provider, dev string, mrSize int) *end {
	t.Helper()
	e, _ := newEndOn(t, p, dev, mrSize, false)
	return e
}

// newEndOn is newEnd, with its CQ attached to a completion channel, which it returns,
// when events is set.
func newEndOn(t testing.TB, p verbs.Provider, dev string, mrSize int, events bool) (*end, verbs.CompChannel) {
	t.Helper()
	e := &end{}
	var err error
	e.ctx, err = p.Open(dev)
	require.NoError(t, err)
	var ch verbs.CompChannel
	if events {
		ch, err = e.ctx.CreateCompChannel()
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{e.qp, e.mr, e.cq, ch, e.pd, e.ctx} {
			if c != nil {
				c.Close()
			}
		}
	})
	e.gid = e.ctx.Device().Ports[0].GIDs[0].GID
	e.pd, err = e.ctx.AllocPD()
	require.NoError(t, err)
	e.cq, err = e.ctx.CreateCQ(1024, ch, 0)
	require.NoError(t, err)
	e.mr, err = e.pd.RegMR(mrSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	require.NoError(t, err)
	e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq,
		Caps: verbs.QPCaps{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	require.NoError(t, err)
	return e, ch
}

// link moves e's QP to RTS, connected to QP qpn of the device whose GID is gid, with
// the given ACK timeout and retry count.
func (e *end) link(t testing.TB, gid verbs.GID, qpn uint32, timeout, retry uint8) {
	t.Helper()
	require.NoError(t, e.qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead}))
	require.NoError(t, e.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: qpn,
		Dest: verbs.AddressVector{Port: 1, IsGlobal: true, DestGID: gid}, MinRNRTimer: 1}))
	require.NoError(t, e.qp.ToRTS(verbs.RTSAttr{Timeout: timeout, RetryCount: retry, RNRRetry: 7}))
}

// connectEnds connects a and b to each other.
func connectEnds(t testing.TB, a, b *end, timeout, retry uint8) {
	t.Helper()
	a.link(t, b.gid, b.qp.QPN(), timeout, retry)
	b.link(t, a.gid, a.qp.QPN(), timeout, retry)
}

// connectedPair returns two ends of p's devices shm0 and shm1, connected, after one
// write with immediate from x to y, both completions reaped: both QPs' connections are
// up, x's to y (its response ring) and y's from x (its request ring).
func connectedPair(t *testing.T, p verbs.Provider) (x, y *end) {
	t.Helper()
	x = newEnd(t, p, "shm0", 4096)
	y = newEnd(t, p, "shm1", 4096)
	connectEnds(t, x, y, 0, 7)
	require.NoError(t, y.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(1, x.mr, y.mr, 0, 8)}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, x.cq, 1)[0].Status)
	require.Equal(t, verbs.WCSuccess, pollWait(t, y.cq, 1)[0].Status)
	return x, y
}

// pollWait polls cq until it has n completions, failing the test after 20 s: a bound
// on something that must happen, never a timing assertion.
func pollWait(t *testing.T, cq verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 64)
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		require.NoError(t, err)
		out = append(out, buf[:k]...)
		if k == 0 {
			require.False(t, time.Now().After(deadline), "waited 20 s for %d completions, got %v", n, out)
			time.Sleep(50 * time.Microsecond) // paces the polls of a completion that must come
		}
	}
	return out
}

// writeImm is a signaled RDMA WRITE_WITH_IMM of n bytes at off of src to off of dst.
func writeImm(id uint64, src, dst verbs.MR, off, n int) verbs.SendWR {
	return verbs.SendWR{ID: id, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: uint32(id),
		SGL:        []verbs.SGE{{Addr: src.Addr() + uint64(off), Length: uint32(n), LKey: src.LKey()}},
		RemoteAddr: dst.Addr() + uint64(off), RKey: dst.RKey()}
}

// channelFD returns a channel's memfd and its mapping, as a requester makes them, for a
// test that plays the requester by hand; both are released when the test ends.
func channelFD(t *testing.T) (int, *channel) {
	t.Helper()
	fd, ch, err := newChannelMemory(nil)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd); ch.unmap() })
	return fd, ch
}
