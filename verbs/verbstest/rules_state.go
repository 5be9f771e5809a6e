package verbstest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testStateMachine: QPs move RESET → INIT → RTR → RTS, any state but RESET → ERROR and any
// state → RESET; other transitions fail with ErrInvalidState and leave the state unchanged,
// and transitions with invalid attributes fail and leave it unchanged too. RESET → ERROR is
// not a transition of the InfiniBand QP state diagram (IBA 10.3.1): the kernel refuses it
// with EINVAL (ib_modify_qp_is_ok), so the rule requires providers to refuse it.
func testStateMachine(t *testing.T, p providers) {
	cfg := defaults()
	a := newEndpoint(t, p, 0, "a", cfg)
	b := newEndpoint(t, p, 1, "b", cfg)

	toInit := func() error { return a.qp.ToInit(verbs.InitAttr{Port: a.port.Num, Access: cfg.qpAccess}) }
	toRTR := func() error { return a.qp.ToRTR(a.rtrAttr(b)) }
	toRTS := func() error { return a.qp.ToRTS(a.rtsAttr()) }
	toError := func() error { return a.qp.ToError() }
	illegal := []struct {
		from verbs.QPState
		name string
		move func() error
	}{
		{verbs.QPStateReset, "RTR", toRTR},
		{verbs.QPStateReset, "RTS", toRTS},
		{verbs.QPStateReset, "ERROR", toError},
		{verbs.QPStateInit, "RTS", toRTS},
		{verbs.QPStateRTR, "INIT", toInit},
		{verbs.QPStateRTS, "INIT", toInit},
		{verbs.QPStateRTS, "RTR", toRTR},
		{verbs.QPStateError, "INIT", toInit},
		{verbs.QPStateError, "RTR", toRTR},
		{verbs.QPStateError, "RTS", toRTS},
	}
	// reach brings a (through RESET) to state st; ERROR through INIT.
	reach := func(st verbs.QPState) {
		t.Helper()
		require.NoError(t, a.qp.ToReset())
		steps := []func() error{toInit, toRTR, toRTS}
		if st == verbs.QPStateError {
			require.NoError(t, toInit())
			require.NoError(t, a.qp.ToError())
		} else {
			for i := 0; i < int(st); i++ {
				require.NoError(t, steps[i](), "reaching %v", st)
			}
		}
		require.Equal(t, st, a.qp.State())
	}
	for _, tc := range illegal {
		reach(tc.from)
		err := tc.move()
		require.ErrorIs(t, err, verbs.ErrInvalidState, "%v → %s", tc.from, tc.name)
		require.Equal(t, tc.from, a.qp.State(), "state after refused %v → %s", tc.from, tc.name)
	}

	// Every state can move to RESET, and every state but RESET to ERROR.
	for _, st := range []verbs.QPState{verbs.QPStateReset, verbs.QPStateInit, verbs.QPStateRTR, verbs.QPStateRTS, verbs.QPStateError} {
		if st != verbs.QPStateReset {
			reach(st)
			require.NoError(t, a.qp.ToError(), "%v → ERROR", st)
			require.Equal(t, verbs.QPStateError, a.qp.State())
		}
		reach(st)
		require.NoError(t, a.qp.ToReset(), "%v → RESET", st)
		require.Equal(t, verbs.QPStateReset, a.qp.State())
	}

	// Invalid attributes change nothing.
	reach(verbs.QPStateReset)
	require.Error(t, a.qp.ToInit(verbs.InitAttr{Port: 0, Access: cfg.qpAccess}), "to INIT on port 0")
	require.Equal(t, verbs.QPStateReset, a.qp.State())
	require.NoError(t, toInit())
	bad := a.rtrAttr(b)
	bad.PathMTU = 0
	require.Error(t, a.qp.ToRTR(bad), "to RTR with path MTU 0")
	require.Equal(t, verbs.QPStateInit, a.qp.State())
	require.NoError(t, toRTR())
	badRTS := a.rtsAttr()
	badRTS.RetryCount = 8
	require.Error(t, a.qp.ToRTS(badRTS), "to RTS with retry count 8")
	require.Equal(t, verbs.QPStateRTR, a.qp.State())

	// A QP reset after an error connects again and carries traffic.
	require.NoError(t, toRTS())
	require.NoError(t, a.qp.ToError())
	require.NoError(t, a.qp.ToReset())
	a.psn += 0x100
	connect(a, b)
	postRecvs(t, b.qp, 1, 1)
	fill(a.mr.Bytes()[:32], 1)
	post(t, a.qp, writeWR(7, a.mr, 0, 32, b.mr, 64, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 7, verbs.WCSuccess)
	requireWC(t, pollOne(t, b.rcq), 1, verbs.WCSuccess)
	require.Equal(t, a.mr.Bytes()[:32], b.mr.Bytes()[64:96])
}

// testPostSendRequiresRTS: PostSend fails with ErrInvalidState in RESET, INIT and RTR,
// naming the first request; PostRecv fails in RESET and works from INIT on.
func testPostSendRequiresRTS(t *testing.T, p providers) {
	cfg := defaults()
	a := newEndpoint(t, p, 0, "a", cfg)
	b := newEndpoint(t, p, 1, "b", cfg)
	wr := writeWR(1, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
	steps := []struct {
		state verbs.QPState
		next  func()
	}{
		{verbs.QPStateReset, a.toInit},
		{verbs.QPStateInit, func() { a.toRTR(b) }},
		{verbs.QPStateRTR, a.toRTS},
	}
	for _, s := range steps {
		require.Equal(t, s.state, a.qp.State())
		err := a.qp.PostSend([]verbs.SendWR{wr, wr})
		requirePostError(t, err, 0, verbs.ErrInvalidState)
		err = a.qp.PostRecv([]verbs.RecvWR{{ID: 1}})
		if s.state == verbs.QPStateReset {
			requirePostError(t, err, 0, verbs.ErrInvalidState)
		} else {
			require.NoError(t, err, "post receive in %v", s.state)
		}
		s.next()
	}
	requireEmpty(t, a.scq, "sends refused before RTS")
	require.Equal(t, verbs.QPStateRTS, a.qp.State())
}

// testRTRReceives: a QP in RTR cannot send but receives.
func testRTRReceives(t *testing.T, p providers) {
	cfg := defaults()
	a := newEndpoint(t, p, 0, "a", cfg)
	b := newEndpoint(t, p, 1, "b", cfg)
	a.toInit()
	b.toInit()
	a.toRTR(b)
	b.toRTR(a)
	a.toRTS()
	require.Equal(t, verbs.QPStateRTR, b.qp.State())
	postRecv(t, b.qp, verbs.RecvWR{ID: 5, SGL: []verbs.SGE{sge(b.mr, 0, 64)}})
	fill(a.mr.Bytes()[:40], 3)
	post(t, a.qp, sendWR(1, a.mr, 0, 40, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 1, verbs.WCSuccess)
	wc := pollOne(t, b.rcq)
	requireWC(t, wc, 5, verbs.WCSuccess)
	require.Equal(t, verbs.WCRecv, wc.Opcode)
	require.Equal(t, uint32(40), wc.ByteLen)
	require.Equal(t, a.mr.Bytes()[:40], b.mr.Bytes()[:40])
}

// testCloseInUse: objects in use cannot be destroyed (EBUSY): a PD with a region or a QP,
// a CQ with a QP, a context with a PD.
func testCloseInUse(t *testing.T, p providers) {
	a := newEndpoint(t, p, 0, "a", defaults())
	require.ErrorIs(t, a.pd.Close(), verbs.ErrBusy, "close PD with a QP and a region")
	require.ErrorIs(t, a.scq.Close(), verbs.ErrBusy, "close CQ used by a QP")
	require.ErrorIs(t, a.ctx.Close(), verbs.ErrBusy, "close context with a PD")
	require.NoError(t, a.qp.Close())
	require.ErrorIs(t, a.pd.Close(), verbs.ErrBusy, "close PD with a region")
	require.NoError(t, a.mr.Close())
	a.qp, a.mr = nil, nil
	require.NoError(t, a.scq.Close(), "close CQ once its QP is gone")
	a.scq = nil
}
