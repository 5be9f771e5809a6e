package verbstest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testFaultBreakLink: requests over a broken link are lost; once the retry budget is spent
// the requester completes with RETRY_EXC_ERR, moves to ERROR and flushes the WRs behind.
// Nothing reaches the responder, which stays as it was.
func testFaultBreakLink(t *testing.T, p providers) {
	f := faultsOf(t, p)
	a, b := newPair(t, p, defaults())
	postRecvs(t, b.qp, 1, 1)
	require.NoError(t, f.BreakQP(a.qp))
	fill(a.mr.Bytes()[:64], 12)
	post(t, a.qp,
		writeWR(1, a.mr, 0, 64, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled),
		writeWR(2, a.mr, 0, 64, b.mr, 128, verbs.OpRDMAWrite, 0),
	)
	wcs := pollN(t, a.scq, 2)
	requireWC(t, wcs[0], 1, verbs.WCRetryExcErr)
	requireWC(t, wcs[1], 2, verbs.WCWRFlushErr)
	waitState(t, a.qp, verbs.QPStateError)
	require.Equal(t, verbs.QPStateRTS, b.qp.State(), "responder behind a broken link")
	requireEmpty(t, b.rcq, "responder behind a broken link")
	require.Equal(t, make([]byte, 192), b.mr.Bytes()[:192], "data crossed a broken link")
}

// testFaultRepairLink: a request lost on a broken link is retransmitted after its ACK
// timeout, and succeeds if the link was repaired within the retry budget.
func testFaultRepairLink(t *testing.T, p providers) {
	f := faultsOf(t, p)
	cfg := defaults()
	// About 0.5 s per attempt unscaled, 4 s in all with the retries: ample time to
	// repair the link, which the next statement does. The first attempt is lost, so the
	// rule waits one timeout, which was 2 s on providers without a time scale (shm).
	cfg.timeout = 17
	cfg.retryCount = 7
	a, b := newPair(t, p, cfg)
	postRecvs(t, b.qp, 1, 1)
	require.NoError(t, f.BreakQP(a.qp))
	fill(a.mr.Bytes()[:64], 13)
	post(t, a.qp,
		writeWR(1, a.mr, 0, 64, b.mr, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled),
		writeWR(2, a.mr, 0, 64, b.mr, 128, verbs.OpRDMAWrite, verbs.SendSignaled),
	)
	require.NoError(t, f.RepairQP(a.qp))
	wcs := pollN(t, a.scq, 2)
	requireWC(t, wcs[0], 1, verbs.WCSuccess)
	requireWC(t, wcs[1], 2, verbs.WCSuccess)
	requireWC(t, pollOne(t, b.rcq), 1, verbs.WCSuccess)
	require.Equal(t, a.mr.Bytes()[:64], b.mr.Bytes()[:64])
	require.Equal(t, a.mr.Bytes()[:64], b.mr.Bytes()[128:192])
	require.Equal(t, verbs.QPStateRTS, a.qp.State())
}

// testFaultDelay: delayed requests complete no earlier than the delay after they were
// posted, still in order, and requests behind them wait for them.
func testFaultDelay(t *testing.T, p providers) {
	f := faultsOf(t, p)
	a, b := newPair(t, p, defaults())
	postRecvs(t, b.qp, 1, 1)
	const delay = 40 * time.Millisecond
	require.NoError(t, f.DelayQP(a.qp, delay))
	fill(a.mr.Bytes()[:64], 14)
	start := time.Now()
	post(t, a.qp,
		writeWR(1, a.mr, 0, 64, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled),
		writeWR(2, a.mr, 0, 64, b.mr, 64, verbs.OpRDMAWriteWithImm, verbs.SendSignaled),
	)
	wcs := pollN(t, a.scq, 2)
	elapsed := time.Since(start)
	require.GreaterOrEqual(t, elapsed, delay, "delayed requests completed early")
	requireWC(t, wcs[0], 1, verbs.WCSuccess)
	requireWC(t, wcs[1], 2, verbs.WCSuccess)
	requireWC(t, pollOne(t, b.rcq), 1, verbs.WCSuccess)
	require.Equal(t, a.mr.Bytes()[:64], b.mr.Bytes()[64:128])

	require.NoError(t, f.DelayQP(a.qp, 0))
	post(t, a.qp, writeWR(3, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 3, verbs.WCSuccess)
}

// testFaultFailQP: a fatal asynchronous error moves the QP to ERROR and flushes every
// outstanding WR; its peer is unaffected.
func testFaultFailQP(t *testing.T, p providers) {
	f := faultsOf(t, p)
	a, b := newPair(t, p, defaults())
	postRecvs(t, a.qp, 30, 2)
	post(t, a.qp,
		sendWR(1, a.mr, 0, 8, verbs.SendSignaled), // stalls: b has no receive WQE
		writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, 0),
	)
	require.NoError(t, f.FailQP(a.qp))
	waitState(t, a.qp, verbs.QPStateError)
	wcs := pollN(t, a.scq, 2)
	requireWC(t, wcs[0], 1, verbs.WCWRFlushErr)
	requireWC(t, wcs[1], 2, verbs.WCWRFlushErr)
	rwcs := pollN(t, a.rcq, 2)
	requireWC(t, rwcs[0], 30, verbs.WCWRFlushErr)
	requireWC(t, rwcs[1], 31, verbs.WCWRFlushErr)
	require.Equal(t, verbs.QPStateRTS, b.qp.State())
}

// testFaultAllocFailure: an injected allocation failure fails exactly the next allocation
// of its kind with ErrNoResources.
func testFaultAllocFailure(t *testing.T, p providers) {
	f := faultsOf(t, p)
	devs, err := p.a.Devices()
	require.NoError(t, err)
	e := newEndpoint(t, p, 0, "a", defaults())
	cases := []struct {
		kind  string
		alloc func() (interface{ Close() error }, error)
	}{
		{"context", func() (interface{ Close() error }, error) { return p.a.Open(devs[0].Name) }},
		{"pd", func() (interface{ Close() error }, error) { return e.ctx.AllocPD() }},
		{"mr", func() (interface{ Close() error }, error) { return e.pd.RegMR(4096, allAccess) }},
		{"cq", func() (interface{ Close() error }, error) { return e.ctx.CreateCQ(16, nil, 0) }},
		{"channel", func() (interface{ Close() error }, error) { return e.ctx.CreateCompChannel() }},
		{"qp", func() (interface{ Close() error }, error) {
			return e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, Caps: e.cfg.caps})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.kind, func(t *testing.T) {
			require.NoError(t, f.FailAllocs(tc.kind, 1))
			obj, err := tc.alloc()
			require.ErrorIs(t, err, verbs.ErrNoResources, "first %s allocation after an injected failure", tc.kind)
			require.Nil(t, obj)
			obj, err = tc.alloc()
			require.NoError(t, err, "second %s allocation", tc.kind)
			require.NoError(t, obj.Close())
		})
	}
}
