package soft_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// nextEvent returns c's next async event, failing the test if none comes in a minute.
func nextEvent(t *testing.T, c verbs.Context) verbs.AsyncEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := c.WaitAsyncEvent(ctx)
	require.NoError(t, err)
	return e
}

// TestSetPortState: bad arguments are refused; a change of state is reported by
// Devices and QueryPort and raises one event on every open context; setting the state
// a port already has raises none.
func TestSetPortState(t *testing.T) {
	f := soft.New(soft.Options{Devices: 2})
	bad := []struct {
		dev   string
		port  uint8
		state verbs.PortState
		want  error
	}{
		{"soft9", 1, verbs.PortDown, verbs.ErrNoDevice},
		{"soft0", 2, verbs.PortDown, verbs.ErrInvalidArgument},
		{"soft0", 0, verbs.PortDown, verbs.ErrInvalidArgument},
		{"soft0", 1, verbs.PortState(9), verbs.ErrInvalidArgument},
	}
	for _, b := range bad {
		err := f.SetPortState(b.dev, b.port, b.state)
		require.ErrorIs(t, err, b.want, "SetPortState(%s, %d, %v)", b.dev, b.port, b.state)
	}

	c1, err := f.Open("soft0")
	require.NoError(t, err)
	c2, err := f.Open("soft0")
	require.NoError(t, err)
	other, err := f.Open("soft1")
	require.NoError(t, err)

	steps := []struct {
		state verbs.PortState
		event verbs.AsyncEventType // -1: none
	}{
		{verbs.PortDown, verbs.EventPortErr},
		{verbs.PortDown, -1},
		{verbs.PortInit, -1}, // not active before or after
		{verbs.PortActive, verbs.EventPortActive},
	}
	for i, s := range steps {
		require.NoError(t, f.SetPortState("soft0", 1, s.state))
		devs, err := f.Devices()
		require.NoError(t, err)
		require.Equal(t, s.state, devs[0].Ports[0].State, "step %d: Devices", i)
		require.Equal(t, verbs.PortActive, devs[1].Ports[0].State, "step %d: the other device", i)
		pa, err := c1.QueryPort(1)
		require.NoError(t, err)
		require.Equal(t, s.state, pa.State, "step %d: QueryPort", i)
		if s.event >= 0 {
			for _, c := range []verbs.Context{c1, c2} {
				require.Equal(t, verbs.AsyncEvent{Type: s.event, Port: 1}, nextEvent(t, c), "step %d", i)
			}
		}
	}
	require.NoError(t, f.RaisePortEvent("soft0", 1, verbs.EventGIDChange))
	require.Equal(t, verbs.AsyncEvent{Type: verbs.EventGIDChange, Port: 1}, nextEvent(t, c1), "only the raised event is pending")
	require.ErrorIs(t, f.RaisePortEvent("soft0", 1, verbs.EventQPFatal), verbs.ErrInvalidArgument)

	require.NoError(t, f.FailDevice("soft1"))
	require.Equal(t, verbs.EventDeviceFatal, nextEvent(t, other).Type)

	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err = other.WaitAsyncEvent(ctx)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "soft1 raised nothing else: %v", err)
	for _, c := range []verbs.Context{c1, c2, other} {
		require.NoError(t, c.Close())
	}
	require.NoError(t, f.SetPortState("soft0", 1, verbs.PortDown), "no context open: nobody to tell")
}
