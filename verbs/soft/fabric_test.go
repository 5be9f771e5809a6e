package soft_test

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestDevices(t *testing.T) {
	tests := []struct {
		opts soft.Options
		want int
	}{
		{soft.Options{}, 1},
		{soft.Options{Devices: -3}, 1},
		{soft.Options{Devices: 3}, 3},
		{soft.Options{Devices: 1000}, 254},
	}
	for _, tc := range tests {
		f := soft.New(tc.opts)
		require.Equal(t, "soft", f.Name())
		devs, err := f.Devices()
		require.NoError(t, err)
		require.Len(t, devs, tc.want, "soft.New(%+v) devices", tc.opts)
		seen := map[verbs.GID]bool{}
		for i, d := range devs {
			require.Equal(t, "soft"+strconv.Itoa(i), d.Name)
			require.Len(t, d.Ports, 1)
			p := d.Ports[0]
			require.Equal(t, uint8(1), p.Num)
			require.Equal(t, verbs.PortActive, p.State)
			require.Equal(t, verbs.LinkLayerEthernet, p.LinkLayer)
			require.Equal(t, verbs.MTU4096, p.ActiveMTU)
			require.Len(t, p.GIDs, 2)
			for _, g := range p.GIDs {
				require.Equal(t, verbs.GIDTypeRoCEv2, g.Type)
				require.False(t, seen[g.GID], "GID %v used twice", g.GID)
				seen[g.GID] = true
			}
			require.Equal(t, netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)}), p.GIDs[1].GID.Addr(), "IPv4 GID of %s", d.Name)
			require.Equal(t, soft.DefaultMaxQPWR, d.MaxQPWR)
			require.Equal(t, soft.DefaultMaxInline, d.MaxInline)
		}
	}

	// Callers get copies: changing them changes nothing.
	f := soft.New(soft.Options{})
	devs, _ := f.Devices()
	devs[0].Ports[0].GIDs[0].GID = verbs.GID{}
	again, _ := f.Devices()
	require.False(t, again[0].Ports[0].GIDs[0].GID.IsZero())
}

func TestOpenAndQueryPort(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	_, err := f.Open("mlx5_0")
	require.ErrorIs(t, err, verbs.ErrNoDevice)
	ctx, err := f.Open("soft1")
	require.NoError(t, err)
	require.Equal(t, "soft1", ctx.Device().Name)
	p, err := ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, verbs.PortActive, p.State)
	_, err = ctx.QueryPort(2)
	require.ErrorIs(t, err, verbs.ErrInvalidArgument)
	require.Equal(t, 1, f.Stats().Contexts)
	require.NoError(t, ctx.Close())
	require.ErrorIs(t, ctx.Close(), verbs.ErrClosed)
}

// TestLimits checks that each device limit is enforced with the error hardware gives:
// ErrNoResources for too many objects, ErrInvalidArgument for sizes over a maximum.
func TestLimits(t *testing.T) {
	f := newFabric(t, soft.Options{Limits: soft.Limits{
		MaxQP: 2, MaxQPWR: 32, MaxSGE: 3, MaxCQ: 3, MaxCQE: 100, MaxMR: 2, MaxMRSize: 1 << 20, MaxInline: 128,
	}})
	ctx, err := f.Open("soft0")
	require.NoError(t, err)
	defer ctx.Close()
	attr := ctx.Device()
	require.Equal(t, 2, attr.MaxQP)
	require.Equal(t, 100, attr.MaxCQE)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()

	_, err = ctx.CreateCQ(101, nil, 0)
	require.ErrorIs(t, err, verbs.ErrInvalidArgument, "CQ over MaxCQE")
	_, err = ctx.CreateCQ(0, nil, 0)
	require.ErrorIs(t, err, verbs.ErrInvalidArgument, "CQ of 0 entries")
	var cqs []verbs.CQ
	for range 3 {
		cq, err := ctx.CreateCQ(100, nil, 0)
		require.NoError(t, err)
		cqs = append(cqs, cq)
	}
	_, err = ctx.CreateCQ(10, nil, 0)
	require.ErrorIs(t, err, verbs.ErrNoResources, "CQ over MaxCQ")

	_, err = pd.RegMR(1<<20+1, access)
	require.ErrorIs(t, err, verbs.ErrInvalidArgument, "MR over MaxMRSize")
	m1, err := pd.RegMR(1<<20, access)
	require.NoError(t, err)
	m2, err := pd.RegMR(0, access)
	require.NoError(t, err)
	_, err = pd.RegMR(16, access)
	require.ErrorIs(t, err, verbs.ErrNoResources, "MR over MaxMR")
	require.NoError(t, m2.Close())
	m2, err = pd.RegMR(16, access)
	require.NoError(t, err, "MR after one was released")

	caps := verbs.QPCaps{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 3, MaxRecvSGE: 3, MaxInlineData: 128}
	bad := []struct {
		name string
		edit func(*verbs.QPCaps)
	}{
		{"MaxSendWR", func(c *verbs.QPCaps) { c.MaxSendWR = 33 }},
		{"NoSendWR", func(c *verbs.QPCaps) { c.MaxSendWR = 0 }},
		{"MaxRecvWR", func(c *verbs.QPCaps) { c.MaxRecvWR = 33 }},
		{"MaxSendSGE", func(c *verbs.QPCaps) { c.MaxSendSGE = 4 }},
		{"MaxRecvSGE", func(c *verbs.QPCaps) { c.MaxRecvSGE = 4 }},
		{"MaxInlineData", func(c *verbs.QPCaps) { c.MaxInlineData = 129 }},
	}
	for _, tc := range bad {
		c := caps
		tc.edit(&c)
		_, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cqs[0], RecvCQ: cqs[1], Caps: c})
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, tc.name)
	}
	_, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cqs[0], Caps: caps})
	require.ErrorIs(t, err, verbs.ErrInvalidArgument, "QP without a receive CQ")
	q1, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cqs[0], RecvCQ: cqs[1], Caps: caps})
	require.NoError(t, err)
	q2, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cqs[0], RecvCQ: cqs[1], Caps: caps})
	require.NoError(t, err)
	_, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cqs[0], RecvCQ: cqs[1], Caps: caps})
	require.ErrorIs(t, err, verbs.ErrNoResources, "QP over MaxQP")
	require.Equal(t, caps, q1.(*soft.QP).Caps())
	require.NotEqual(t, q1.QPN(), q2.QPN())

	for _, c := range []interface{ Close() error }{q1, q2, m1, m2, cqs[0], cqs[1], cqs[2]} {
		require.NoError(t, c.Close())
	}
}

// TestCrossContext checks that objects of different contexts don't mix.
func TestCrossContext(t *testing.T) {
	f := newFabric(t, soft.Options{})
	c1, err := f.Open("soft0")
	require.NoError(t, err)
	defer c1.Close()
	c2, err := f.Open("soft0")
	require.NoError(t, err)
	defer c2.Close()
	ch, err := c1.CreateCompChannel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = c2.CreateCQ(4, ch, 0)
	require.ErrorIs(t, err, verbs.ErrInvalidArgument, "CQ with another context's channel")
	cq, err := c1.CreateCQ(4, nil, 0)
	require.NoError(t, err)
	defer cq.Close()
	pd, err := c2.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	_, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: verbs.QPCaps{MaxSendWR: 1}})
	require.ErrorIs(t, err, verbs.ErrInvalidArgument, "QP with another context's CQ")
}

func TestRegMRAccess(t *testing.T) {
	f := newFabric(t, soft.Options{})
	ctx, err := f.Open("soft0")
	require.NoError(t, err)
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	tests := []struct {
		access verbs.AccessFlags
		ok     bool
	}{
		{0, true},
		{verbs.AccessLocalWrite, true},
		{verbs.AccessRemoteRead, true},
		{verbs.AccessLocalWrite | verbs.AccessRemoteWrite, true},
		{verbs.AccessRemoteWrite, false}, // remote write needs local write
		{1 << 7, false},
	}
	for _, tc := range tests {
		m, err := pd.RegMR(64, tc.access)
		if !tc.ok {
			require.ErrorIs(t, err, verbs.ErrInvalidArgument, "RegMR(64, %#x)", tc.access)
			continue
		}
		require.NoError(t, err, "RegMR(64, %#x)", tc.access)
		require.Equal(t, tc.access, m.Access())
		require.Len(t, m.Bytes(), 64)
		require.NoError(t, m.Close())
		require.ErrorIs(t, m.Close(), verbs.ErrClosed)
	}
	_, err = pd.RegMR(-1, 0)
	require.ErrorIs(t, err, verbs.ErrInvalidArgument)
}

// TestMRAddresses checks that regions get disjoint, page-aligned, never reused addresses
// and keys that change when a table slot is reused.
func TestMRAddresses(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	type span struct{ lo, hi uint64 }
	var spans []span
	keys := map[uint32]bool{}
	for _, dev := range []string{"soft0", "soft1"} {
		ctx, err := f.Open(dev)
		require.NoError(t, err)
		pd, err := ctx.AllocPD()
		require.NoError(t, err)
		for i := range 20 {
			m, err := pd.RegMR(1+i*1000, access)
			require.NoError(t, err)
			require.Zero(t, m.Addr()%4096, "address %#x not page aligned", m.Addr())
			require.Equal(t, m.LKey(), m.RKey())
			require.NotZero(t, m.LKey())
			spans = append(spans, span{m.Addr(), m.Addr() + uint64(len(m.Bytes()))})
			if dev == "soft0" {
				require.False(t, keys[m.LKey()], "key %#x reused", m.LKey())
				keys[m.LKey()] = true
			}
			require.NoError(t, m.Close())
		}
		require.NoError(t, pd.Close())
		require.NoError(t, ctx.Close())
	}
	for i := range spans {
		for j := range i {
			require.False(t, spans[i].lo < spans[j].hi && spans[j].lo < spans[i].hi, "regions %d and %d overlap", i, j)
		}
	}
}

// TestStats checks the live counts and the traffic counters.
func TestStats(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	before := f.Stats()
	a, b := connectPair(t, f, pairOpts{})
	s := f.Stats()
	require.Equal(t, soft.Stats{Contexts: 2, PDs: 2, MRs: 2, CQs: 4, QPs: 2}, s, "after creating a pair (before %+v)", before)

	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 1000), writeImm(2, a.mr, b.mr, 0, 24)}))
	poll(t, a.scq, 1)
	s = f.Stats()
	require.Equal(t, uint64(1), s.WRs)
	require.Equal(t, uint64(1000), s.Bytes)
	require.NotZero(t, s.RNRNAKs, "the second write found no receive WQE")
	require.Zero(t, s.Errors)

	require.NoError(t, a.qp.ToError()) // flushes the second write, waiting in RNR
	wcs := poll(t, a.scq, 1)
	require.Equal(t, verbs.WCWRFlushErr, wcs[0].Status)
	s = f.Stats()
	require.Equal(t, uint64(1), s.Flushed)
}
