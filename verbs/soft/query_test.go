package soft_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestQueryQP: Query reports the state and the address vector of the RTR transition,
// traffic class and service level included.
func TestQueryQP(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	o := pairOpts{}
	o.defaults(f)
	a := newSide(t, f, o.devA, o, 0x10)
	b := newSide(t, f, o.devB, o, 0x20)
	q := a.qp.(verbs.QPQuerier)
	attr, err := q.Query()
	require.NoError(t, err)
	require.Equal(t, verbs.QPStateReset, attr.State)

	require.NoError(t, a.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	r := rtr(a, b, o)
	r.Dest.TrafficClass, r.Dest.SL = 0x68, 3 // DSCP 26 (AF31), SL 3
	require.NoError(t, a.qp.ToRTR(r))
	attr, err = q.Query()
	require.NoError(t, err)
	require.Equal(t, verbs.QPAttr{State: verbs.QPStateRTR, PathMTU: verbs.MTU4096, DestQPN: b.qp.QPN(), Dest: r.Dest}, attr)
	require.NoError(t, a.qp.Close())
	_, err = q.Query()
	require.ErrorIs(t, err, verbs.ErrClosed)
}
