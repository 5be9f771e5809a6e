package shm

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckPeer: a peer is accepted only if its user is allowed.
func TestCheckPeer(t *testing.T) {
	p := newProvider(t, 1)
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
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socketName(p.devices[0].gid), Net: "unixpacket"})
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
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socketName(p.devices[0].gid), Net: "unixpacket"})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, p.Close())
	_, err = c.Read(make([]byte, 8))
	require.Error(t, err, "a connection to a closed device")
	_, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socketName(p.devices[0].gid), Net: "unixpacket"})
	require.Error(t, err, "dial a closed device")
}
