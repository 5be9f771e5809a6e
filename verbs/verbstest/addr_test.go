package verbstest

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestOnAddr checks that OnAddr narrows a provider to the device and GID of an address,
// keeping the GID's index in the device's table, and keeps fault injection.
func TestOnAddr(t *testing.T) {
	fab := soft.New(soft.Options{Devices: 3})
	cases := []struct {
		ip   string
		dev  string
		gidx int
	}{
		{"127.0.0.1", "soft0", 1},
		{"127.0.0.3", "soft2", 1}, // index 1: the fe80:: GID at index 0 is left out
		{"::ffff:127.0.0.2", "soft1", 1},
	}
	for _, tc := range cases {
		p, err := OnAddr(fab, netip.MustParseAddr(tc.ip))
		require.NoError(t, err, "OnAddr(%s)", tc.ip)
		devs, err := p.Devices()
		require.NoError(t, err)
		require.Len(t, devs, 1, "OnAddr(%s).Devices()", tc.ip)
		require.Equal(t, tc.dev, devs[0].Name, "OnAddr(%s)", tc.ip)
		require.Len(t, devs[0].Ports, 1)
		gids := devs[0].Ports[0].GIDs
		require.Len(t, gids, 1)
		require.Equal(t, tc.gidx, gids[0].Index, "OnAddr(%s): hardware index of the GID", tc.ip)
		require.Equal(t, netip.MustParseAddr(tc.ip).Unmap(), gids[0].GID.Addr())
		_, ok := p.(Faults)
		require.True(t, ok, "OnAddr of a provider with faults injects faults")
	}
	_, err := OnAddr(fab, netip.MustParseAddr("10.9.9.9"))
	require.ErrorIs(t, err, verbs.ErrNoDevice)
}
