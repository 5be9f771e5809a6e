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

// TestTransportCause: a QP that cannot connect to its destination QP's socket (here an
// injected failure; in production a process out of file descriptors) retries as for a
// lost request, and once the retries are spent its completion says only
// WCRetryExcErr: TransportCause names the error behind it, and forgets it once a
// connection succeeds and at RESET.
func TestTransportCause(t *testing.T) {
	tests := []struct {
		name     string
		timeout  uint8  // the ACK timeout's exponent: 0 is none, so a failed dial fails the request at once; 14 is 67 ms
		fail     string // what fails: "dial" (the connection to the peer) or "region" (mapping the peer's region)
		failures int    // how many times
		status   verbs.WCStatus
		cause    string // in the cause, which matches verbs.ErrNoResources; "" for none
	}{
		{"connects", 0, "dial", 0, verbs.WCSuccess, ""},
		{"cannot connect", 0, "dial", 1, verbs.WCRetryExcErr, "dial QP"},
		{"connects on a retry", 14, "dial", 1, verbs.WCSuccess, ""},
		{"cannot map the region", 0, "region", 1, verbs.WCRetryExcErr, "map peer region"},
		{"maps the region on a retry", 14, "region", 1, verbs.WCSuccess, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, 1)
			a := newEnd(t, p, "shm0", 4096)
			b := newEnd(t, p, "shm0", 4096)
			connectEnds(t, a, b, tt.timeout, 7)
			require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
			require.NoError(t, p.FailAllocs(tt.fail, tt.failures))
			require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(7, a.mr, b.mr, 0, 64)}))
			wc := pollWait(t, a.cq, 1)[0]
			require.Equal(t, tt.status, wc.Status, "completion %+v", wc)

			causer, ok := a.qp.(verbs.TransportCauser)
			require.True(t, ok, "shm's QP is a verbs.TransportCauser")
			cause := causer.TransportCause()
			if tt.cause == "" {
				require.NoError(t, cause)
				return
			}
			require.ErrorIs(t, cause, verbs.ErrNoResources)
			require.ErrorContains(t, cause, tt.cause)
			require.NoError(t, a.qp.ToReset())
			require.NoError(t, causer.TransportCause(), "RESET forgets the cause")
		})
	}
}

// TestAcceptRetries: a QP whose accept of a requester's connection fails (a process out
// of file descriptors) keeps accepting after a pause, so the requester's retransmission
// over a new connection is answered and its write completes.
func TestAcceptRetries(t *testing.T) {
	p := newProvider(t, 1)
	a := newEnd(t, p, "shm0", 4096)
	b := newEnd(t, p, "shm0", 4096)
	connectEnds(t, a, b, 14, 7) // an ACK timeout of 67 ms: the requester retransmits
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.NoError(t, p.FailAllocs("accept", 2))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(7, a.mr, b.mr, 0, 64)}))
	wc := pollWait(t, a.cq, 1)[0]
	require.Equal(t, verbs.WCSuccess, wc.Status, "completion %+v", wc)
	require.Equal(t, verbs.WCSuccess, pollWait(t, b.cq, 1)[0].Status)
}
