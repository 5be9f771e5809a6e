package shm

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestCheckPeer: a peer is accepted only if its user is allowed.
func TestCheckPeer(t *testing.T) {
	p := newProvider(t, 1)
	e := newEnd(t, p, "shm0", 4096)
	own := uint32(os.Getuid())
	tests := []struct {
		name  string
		allow map[uint32]bool
		ok    bool
	}{
		{"SameUser", map[uint32]bool{own: true}, true},
		{"OtherUserAllowed", map[uint32]bool{own: true, own + 1: true}, true},
		{"NotAllowed", map[uint32]bool{own + 1: true}, false},
		{"NoOne", map[uint32]bool{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: qpSocketName(e.qp.QPN()), Net: "unixpacket"})
			require.NoError(t, err)
			defer c.Close()
			err = checkPeer(c, tt.allow)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, errPeerUser)
			}
		})
	}
}

// TestProviderClose: closing the provider ends its accept loops and the connections
// they serve (goleak checks that nothing is left), and requesters see a dead link.
func TestProviderClose(t *testing.T) {
	p, err := New(Options{Devices: 1})
	require.NoError(t, err)
	e := newEnd(t, p, "shm0", 4096)
	name := &net.UnixAddr{Name: qpSocketName(e.qp.QPN()), Net: "unixpacket"}
	c, err := net.DialUnix("unixpacket", nil, name)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, p.Close())
	_, err = c.Read(make([]byte, 8))
	require.Error(t, err, "a connection to a closed provider's QP")
	_, err = net.DialUnix("unixpacket", nil, name)
	require.Error(t, err, "dial a closed provider's QP")
}

// TestQPCloseEndsAcceptedConnections: destroying a QP closes the connections its socket
// accepted, so a peer still sending to it sees a dead link at once. With an ACK timeout
// of 0 (wait forever) the peer's write ends only that way: answered with drops by a
// connection left open, it would wait for as long as the peer's process lived.
func TestQPCloseEndsAcceptedConnections(t *testing.T) {
	p := newProvider(t, 2)
	x, y := connectedPair(t, p) // y serves x's connection
	require.NoError(t, y.qp.Close())
	y.qp = nil // closed: the cleanup skips it

	require.NoError(t, x.qp.PostSend([]verbs.SendWR{writeImm(2, x.mr, y.mr, 0, 8)}))
	wc := pollWait(t, x.cq, 1)[0]
	require.Equal(t, verbs.WCRetryExcErr, wc.Status, "a write to a destroyed QP")
	require.Equal(t, uint64(2), wc.WRID)
	require.Equal(t, verbs.QPStateError, x.qp.State())
}
