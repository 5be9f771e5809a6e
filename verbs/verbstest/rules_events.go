package verbstest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// PortFaults is implemented by providers that can change a port's state, as taking a
// link or netdev down does (verbs/soft does; on rxe, `ip link set dev down`).
type PortFaults interface {
	SetPortState(device string, port uint8, state verbs.PortState) error
}

// waitEvent waits for ctx's next event of type typ, skipping others (a device may raise
// events of its own, such as COMM_EST), for at most waitLimit.
func waitEvent(t *testing.T, c verbs.Context, typ verbs.AsyncEventType) verbs.AsyncEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		ev, err := c.WaitAsyncEvent(ctx)
		require.NoError(t, err, "waiting for %v", typ)
		if ev.Type == typ {
			return ev
		}
	}
}

// testAsyncEventsClosed: closing a context wakes a WaitAsyncEvent in progress, and
// every later one, with ErrClosed.
func testAsyncEventsClosed(t *testing.T, p providers) {
	devs, err := p.a.Devices()
	require.NoError(t, err)
	c, err := p.a.Open(devs[0].Name)
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() {
		for {
			if _, err := c.WaitAsyncEvent(context.Background()); err != nil {
				waiting <- err
				return
			}
		}
	}()
	require.NoError(t, c.Close())
	select {
	case err := <-waiting:
		require.ErrorIs(t, err, verbs.ErrClosed, "a wait in progress when the context closed")
	case <-time.After(waitLimit):
		t.Fatal("WaitAsyncEvent still blocked after Close")
	}
	_, err = c.WaitAsyncEvent(context.Background())
	require.ErrorIs(t, err, verbs.ErrClosed, "a wait after Close")
}

// testAsyncEventsContext: WaitAsyncEvent returns ctx's error when ctx ends with no
// event pending (events the device raises meanwhile are returned first).
func testAsyncEventsContext(t *testing.T, p providers) {
	a, _ := newPair(t, p, defaults())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	for {
		_, err := a.ctx.WaitAsyncEvent(ctx)
		if err != nil {
			require.Equal(t, ctx.Err(), err, "WaitAsyncEvent = %v, want the context's error itself", err)
			return
		}
	}
}

// testFaultFailQPEvent: a QP moved to ERROR by a fatal error raises EventQPFatal,
// naming the QP, on its device's contexts.
func testFaultFailQPEvent(t *testing.T, p providers) {
	f := faultsOf(t, p)
	a, _ := newPair(t, p, defaults())
	require.NoError(t, f.FailQP(a.qp))
	ev := waitEvent(t, a.ctx, verbs.EventQPFatal)
	require.Equal(t, a.qp.QPN(), ev.QPN, "the event names the failed QP")
}

// testFaultPortDown: a port leaving the active state raises EventPortErr naming it
// and reports DOWN; requests sent meanwhile are lost (RETRY_EXC_ERR, the QP is not
// failed by the event itself); the port coming back raises EventPortActive.
func testFaultPortDown(t *testing.T, p providers) {
	pf, ok := p.a.(PortFaults)
	if !ok {
		t.Skipf("provider %s does not implement verbstest.PortFaults", p.a.Name())
	}
	a, b := newPair(t, p, defaults())
	dev := a.ctx.Device().Name
	require.NoError(t, pf.SetPortState(dev, a.port.Num, verbs.PortDown))
	ev := waitEvent(t, a.ctx, verbs.EventPortErr)
	require.Equal(t, a.port.Num, ev.Port)
	pa, err := a.ctx.QueryPort(a.port.Num)
	require.NoError(t, err)
	require.Equal(t, verbs.PortDown, pa.State)
	require.Equal(t, verbs.QPStateRTS, a.qp.State(), "a port event does not fail the QP")

	post(t, a.qp, writeWR(1, a.mr, 0, 64, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 1, verbs.WCRetryExcErr)

	require.NoError(t, pf.SetPortState(dev, a.port.Num, verbs.PortActive))
	ev = waitEvent(t, a.ctx, verbs.EventPortActive)
	require.Equal(t, a.port.Num, ev.Port)
}
