package shm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// The conformance suite drives the fault injection (its Fault rules); these are the
// arguments it never passes.
func TestFaultArguments(t *testing.T) {
	p := newProvider(t, 1)
	other := newProvider(t, 1)
	e := newEnd(t, other, "shm0", 4096)
	tests := []struct {
		name string
		err  error
	}{
		{"FailAllocs unknown kind", p.FailAllocs("socket", 1)},
		{"BreakQP of another provider", p.BreakQP(e.qp)},
		{"RepairQP of another provider", p.RepairQP(e.qp)},
		{"DelayQP of another provider", p.DelayQP(e.qp, 1)},
		{"FailQP of another provider", p.FailQP(e.qp)},
		{"SetPortState of port 2", p.SetPortState("shm0", 2, verbs.PortDown)},
	}
	for _, tt := range tests {
		require.ErrorIs(t, tt.err, verbs.ErrInvalidArgument, tt.name)
	}
	require.ErrorIs(t, p.SetPortState("shm9", 1, verbs.PortDown), verbs.ErrNoDevice)
	require.Equal(t, verbs.QPStateReset, e.qp.State(), "a QP of another provider is untouched")
}
