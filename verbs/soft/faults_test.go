package soft_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestBreakLink checks that a broken link between devices loses requests both ways until
// repaired, and leaves other links alone.
func TestBreakLink(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 3})
	a, b := connectPair(t, f, pairOpts{devA: "soft0", devB: "soft1", timeout: 19, retry: 7})
	c, d := connectPair(t, f, pairOpts{devA: "soft0", devB: "soft2"})
	require.NoError(t, f.BreakLink("soft1", "soft0"))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))
	require.NoError(t, b.qp.PostSend([]verbs.SendWR{writeImm(2, b.mr, a.mr, 64, 8)})) // other bytes than a's write: both run at once
	require.NoError(t, d.qp.PostRecv([]verbs.RecvWR{{ID: 3}}))
	require.NoError(t, c.qp.PostSend([]verbs.SendWR{writeImm(3, c.mr, d.mr, 0, 8)}))
	require.Equal(t, verbs.WCSuccess, poll(t, c.scq, 1)[0].Status, "soft0-soft2 while soft0-soft1 is broken")
	requireEmpty(t, a.scq)
	requireEmpty(t, b.scq)

	require.NoError(t, a.qp.PostRecv([]verbs.RecvWR{{ID: 20}}))
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 10}}))
	require.NoError(t, f.RepairLink("soft0", "soft1"))
	require.Equal(t, verbs.WCSuccess, poll(t, a.scq, 1)[0].Status)
	require.Equal(t, verbs.WCSuccess, poll(t, b.scq, 1)[0].Status)
	require.NotZero(t, f.Stats().Retries)

	require.ErrorIs(t, f.BreakLink("soft0", "nope"), verbs.ErrNoDevice)
}

// TestBreakLinkRetryExceeded checks the requester side of a link that stays broken.
func TestBreakLinkRetryExceeded(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{retry: 1})
	require.NoError(t, f.BreakLink("soft0", "soft1"))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))
	require.Equal(t, verbs.WCRetryExcErr, poll(t, a.scq, 1)[0].Status)
	require.Equal(t, verbs.QPStateError, a.qp.State())
	require.Equal(t, verbs.QPStateRTS, b.qp.State())
	require.Equal(t, uint64(1), f.Stats().Retries)
}

// TestDelayLink checks that a link delay holds requests back by at least the delay, and
// that the delay applies to requests posted after it is set.
func TestDelayLink(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	const delay = 30 * time.Millisecond
	require.NoError(t, f.DelayLink("soft0", "soft1", delay))
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	start := time.Now()
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 8)}))
	requireEmpty(t, b.rcq)
	poll(t, b.rcq, 1)
	require.GreaterOrEqual(t, time.Since(start), delay)
	require.NoError(t, f.DelayLink("soft0", "soft1", 0))
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 2}}))
	poll(t, a.scq, 1)
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(2, a.mr, b.mr, 0, 8)}))
	// Without delay and with nothing queued, the request runs inside PostSend.
	var wc [1]verbs.WorkCompletion
	n, err := b.rcq.Poll(wc[:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// TestFailDevice checks that every QP of a failed device moves to ERROR and is flushed,
// and that peers on other devices are untouched.
func TestFailDevice(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	c, d := connectPair(t, f, pairOpts{devA: "soft0", devB: "soft0"})
	require.NoError(t, a.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.NoError(t, c.qp.PostRecv([]verbs.RecvWR{{ID: 2}}))
	require.NoError(t, f.FailDevice("soft0"))
	for _, s := range []*side{a, c, d} {
		require.Equal(t, verbs.QPStateError, s.qp.State())
	}
	require.Equal(t, verbs.QPStateRTS, b.qp.State())
	require.Equal(t, verbs.WCWRFlushErr, poll(t, a.rcq, 1)[0].Status)
	require.Equal(t, verbs.WCWRFlushErr, poll(t, c.rcq, 1)[0].Status)
	require.ErrorIs(t, f.FailDevice("nope"), verbs.ErrNoDevice)
}

// TestFaultArguments checks that fault injection rejects what it cannot act on.
func TestFaultArguments(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	other := newFabric(t, soft.Options{})
	a, _ := connectPair(t, f, pairOpts{})
	for _, err := range []error{
		other.BreakQP(a.qp), other.RepairQP(a.qp), other.DelayQP(a.qp, time.Second), other.FailQP(a.qp),
		f.BreakQP(nil), f.FailAllocs("gpu", 1), f.DelayLink("x", "y", 0),
	} {
		require.Error(t, err)
	}
	require.NoError(t, f.FailAllocs(soft.AllocQP, 3))
	require.NoError(t, f.FailAllocs(soft.AllocQP, 0), "cancel")
	qp, err := a.pd.CreateQP(verbs.QPInitAttr{SendCQ: a.scq, RecvCQ: a.rcq, Caps: verbs.QPCaps{MaxSendWR: 1}})
	require.NoError(t, err)
	require.NoError(t, qp.Close())
}
