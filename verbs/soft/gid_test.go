package soft_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

func gidOf(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }

// holes is a GID table as a kernel leaves it after addresses were deleted: 127.0.0.1 at
// hardware index 5, the third populated entry.
var holes = []verbs.GIDEntry{
	{Index: 5, GID: gidOf("::ffff:127.0.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
	{Index: 0, GID: gidOf("fe80::1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
	{Index: 2, GID: gidOf("::ffff:10.0.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
}

func TestPortConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  soft.PortConfig
		want verbs.PortAttr
	}{
		{"holes, sorted, netdevs from the GIDs", soft.PortConfig{GIDs: holes}, verbs.PortAttr{
			Num: 1, State: verbs.PortActive, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU4096, LinkLayer: verbs.LinkLayerEthernet,
			GIDs: []verbs.GIDEntry{holes[1], holes[2], holes[0]}, Netdevs: []string{"eth0", "lo"},
		}},
		{"InfiniBand, down, IPoIB netdev", soft.PortConfig{
			LinkLayer: verbs.LinkLayerInfiniBand, State: verbs.PortDown, LID: 7, Netdevs: []string{"ib0"},
			GIDs: []verbs.GIDEntry{{Index: 1, GID: gidOf("fe80::2:c903:1:1"), Type: verbs.GIDTypeIB}},
		}, verbs.PortAttr{
			Num: 1, State: verbs.PortDown, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU4096, LinkLayer: verbs.LinkLayerInfiniBand, LID: 7,
			GIDs: []verbs.GIDEntry{{Index: 1, GID: gidOf("fe80::2:c903:1:1"), Type: verbs.GIDTypeIB}}, Netdevs: []string{"ib0"},
		}},
	}
	for _, tt := range tests {
		f := soft.New(soft.Options{Devices: 2, Ports: []soft.PortConfig{tt.cfg}})
		devs, err := f.Devices()
		require.NoError(t, err, tt.name)
		require.Equal(t, tt.want, devs[0].Ports[0], tt.name)
		// The second device keeps the default port.
		require.Equal(t, []string{"lo"}, devs[1].Ports[0].Netdevs, tt.name)
		require.Equal(t, gidOf("::ffff:127.0.0.2"), devs[1].Ports[0].GIDs[1].GID, tt.name)
	}
}

func TestPortConfigInvalid(t *testing.T) {
	g := gidOf("::ffff:10.0.0.1")
	tests := []struct {
		name string
		gids []verbs.GIDEntry
		want string
	}{
		{"negative index", []verbs.GIDEntry{{Index: -1, GID: g}}, "soft: device 0: GID index -1 outside [0, 65536)"},
		{"index too large", []verbs.GIDEntry{{Index: 1 << 16, GID: g}}, "soft: device 0: GID index 65536 outside [0, 65536)"},
		{"index twice", []verbs.GIDEntry{{Index: 3, GID: g}, {Index: 3, GID: gidOf("fe80::1")}}, "soft: device 0: GID index 3 given twice"},
		{"zero GID", []verbs.GIDEntry{{Index: 4}}, "soft: device 0: GID index 4 is the zero GID, an empty entry"},
	}
	for _, tt := range tests {
		f := soft.New(soft.Options{Ports: []soft.PortConfig{{GIDs: tt.gids}}})
		_, err := f.Devices()
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, tt.name)
		require.ErrorContains(t, err, tt.want, tt.name)
		_, err = f.Open("soft0")
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, tt.name)
	}
}

// TestSGIDIndex connects two QPs of a device whose table has holes. The address vector
// names the source GID by hardware index: an empty index fails ToRTR; an index naming
// another GID than the one the peer was told sends from that GID, and the peer drops
// the requests (retry exceeded), as rxe drops a packet from an unexpected address.
func TestSGIDIndex(t *testing.T) {
	tests := []struct {
		name      string
		sgidIndex uint8
		rtrErr    bool
		want      verbs.WCStatus
	}{
		{"hardware index of the GID the peer knows", 5, false, verbs.WCSuccess},
		{"empty entry", 3, true, 0},
		{"beyond the table", 200, true, 0},
		{"position in the populated list, not the index", 2, false, verbs.WCRetryExcErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{TimeScale: 0.001, Ports: []soft.PortConfig{{GIDs: holes}}})
			o := pairOpts{devA: "soft0", devB: "soft0"}
			o.defaults(f)
			a := newSide(t, f, "soft0", o, 0x1000)
			b := newSide(t, f, "soft0", o, 0x2000)
			a.gid, b.gid = gidOf("::ffff:127.0.0.1"), gidOf("::ffff:127.0.0.1") // what each tells the other
			for _, s := range []*side{a, b} {
				require.NoError(t, s.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
			}
			ra := rtr(a, b, o)
			ra.Dest.SGIDIndex = tt.sgidIndex
			err := a.qp.ToRTR(ra)
			if tt.rtrErr {
				require.ErrorIs(t, err, verbs.ErrInvalidArgument)
				require.ErrorContains(t, err, "is empty")
				require.Equal(t, verbs.QPStateInit, a.qp.State())
				return
			}
			require.NoError(t, err)
			rb := rtr(b, a, o)
			rb.Dest.SGIDIndex = 5
			require.NoError(t, b.qp.ToRTR(rb))
			require.NoError(t, a.qp.ToRTS(rts(a, o)))
			require.NoError(t, b.qp.ToRTS(rts(b, o)))

			require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
			copy(a.mr.Bytes(), "from the right GID")
			require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(7, a.mr, b.mr, 0, 18)}))
			wc := poll(t, a.scq, 1)
			require.Equal(t, tt.want, wc[0].Status, "requester's completion")
			if tt.want == verbs.WCSuccess {
				poll(t, b.rcq, 1)
				require.Equal(t, "from the right GID", string(b.mr.Bytes()[:18]))
			} else {
				requireEmpty(t, b.rcq)
			}
		})
	}
}
