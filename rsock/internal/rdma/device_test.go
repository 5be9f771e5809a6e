package rdma

import (
	"context"
	"io"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

func gidOf(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }

// TestSelectPort checks the choice of device, port and GID, and that the index handed
// on is the hardware index of the entry, not its position in PortAttr.GIDs.
func TestSelectPort(t *testing.T) {
	linkLocal := verbs.GID{0xfe, 0x80, 15: 1}
	roce := func(name string, state verbs.PortState, gids ...verbs.GIDEntry) verbs.DeviceAttr {
		return verbs.DeviceAttr{Name: name, Ports: []verbs.PortAttr{{
			Num: 1, State: state, LinkLayer: verbs.LinkLayerEthernet, ActiveMTU: verbs.MTU1024, GIDs: gids,
		}}}
	}
	ib := func(name string, gids ...verbs.GIDEntry) verbs.DeviceAttr {
		return verbs.DeviceAttr{Name: name, Ports: []verbs.PortAttr{{
			Num: 1, State: verbs.PortActive, LinkLayer: verbs.LinkLayerInfiniBand, LID: 7, GIDs: gids,
		}}}
	}
	v1 := func(i int, g verbs.GID) verbs.GIDEntry {
		return verbs.GIDEntry{Index: i, GID: g, Type: verbs.GIDTypeRoCEv1}
	}
	v2 := func(i int, g verbs.GID) verbs.GIDEntry {
		return verbs.GIDEntry{Index: i, GID: g, Type: verbs.GIDTypeRoCEv2}
	}
	// The table of issue 19: indices {0, 1, 4, 5}, the address at 4 (v1) and 5 (v2).
	holes := roce("rxe0", verbs.PortActive,
		v1(0, linkLocal), v2(1, linkLocal), v1(4, gidOf("::ffff:10.77.0.9")), v2(5, gidOf("::ffff:10.77.0.9")))

	tests := []struct {
		name      string
		devs      []verbs.DeviceAttr
		ip        string
		wantDev   string
		wantIndex int
		wantGID   verbs.GID
	}{
		{"holes: hardware index", []verbs.DeviceAttr{holes}, "10.77.0.9", "rxe0", 5, gidOf("::ffff:10.77.0.9")},
		{"mapped address", []verbs.DeviceAttr{holes}, "::ffff:10.77.0.9", "rxe0", 5, gidOf("::ffff:10.77.0.9")},
		{"v1 only", []verbs.DeviceAttr{roce("r", verbs.PortActive, v1(9, gidOf("::ffff:10.0.0.1")))}, "10.0.0.1", "r", 9, gidOf("::ffff:10.0.0.1")},
		{"down port skipped", []verbs.DeviceAttr{
			roce("down", verbs.PortDown, v2(0, gidOf("::ffff:10.0.0.1"))),
			roce("up", verbs.PortActive, v2(3, gidOf("::ffff:10.0.0.1"))),
		}, "10.0.0.1", "up", 3, gidOf("::ffff:10.0.0.1")},
		{"RoCE beats IB", []verbs.DeviceAttr{
			ib("mlx", verbs.GIDEntry{Index: 0, GID: linkLocal}),
			holes,
		}, "10.77.0.9", "rxe0", 5, gidOf("::ffff:10.77.0.9")},
		{"IB: lowest populated index", []verbs.DeviceAttr{
			ib("mlx", verbs.GIDEntry{Index: 3, GID: gidOf("fe80::3")}, verbs.GIDEntry{Index: 2, GID: gidOf("fe80::2")}),
		}, "10.0.0.1", "mlx", 2, gidOf("fe80::2")},
		{"index an address vector cannot name", []verbs.DeviceAttr{
			roce("big", verbs.PortActive, v2(300, gidOf("::ffff:10.0.0.1")), v1(7, gidOf("::ffff:10.0.0.1"))),
		}, "10.0.0.1", "big", 7, gidOf("::ffff:10.0.0.1")},
	}
	for _, tt := range tests {
		d, path, err := selectPort(tt.devs, netip.MustParseAddr(tt.ip))
		require.NoError(t, err, "%s: selectPort(%s)", tt.name, tt.ip)
		if d.Name != tt.wantDev || path.gid.Index != tt.wantIndex || path.gid.GID != tt.wantGID {
			t.Errorf("%s: selectPort(%s) = %s GID[%d] %v, want %s GID[%d] %v", tt.name, tt.ip,
				d.Name, path.gid.Index, path.gid.GID, tt.wantDev, tt.wantIndex, tt.wantGID)
		}
	}

	_, _, err := selectPort([]verbs.DeviceAttr{holes}, netip.MustParseAddr("10.77.0.8"))
	require.ErrorIs(t, err, verbs.ErrNoDevice)
}

// provider wraps a soft fabric: Devices and Open can be held at a gate, counted, and
// Devices can report a different GID table (see sparse).
type provider struct {
	*soft.Fabric
	gate   chan struct{} // nil: no gate; else Devices and Open wait for it to close
	gateOn string        // "devices" or "open"
	lists  atomic.Int64  // Devices calls
	table  []verbs.GIDEntry
	toSoft map[int]uint8 // hardware index in table -> soft's index

	mu        sync.Mutex
	sgidIndex []uint8 // SGIDIndex of every ToRTR, as the device got it
}

func (p *provider) wait(step string) {
	if p.gate != nil && p.gateOn == step {
		<-p.gate
	}
}

func (p *provider) Devices() ([]verbs.DeviceAttr, error) {
	p.lists.Add(1)
	p.wait("devices")
	attrs, err := p.Fabric.Devices()
	if err == nil && p.table != nil {
		attrs[0].Ports[0].GIDs = slices.Clone(p.table)
	}
	return attrs, err
}

func (p *provider) Open(name string) (verbs.Context, error) {
	p.wait("open")
	c, err := p.Fabric.Open(name)
	if err != nil || p.toSoft == nil {
		return c, err
	}
	return &sparseContext{Context: c, p: p}, nil
}

// sparseContext, sparsePD and sparseQP stand for a device whose GID table has holes:
// ToRTR records the index the engine names and hands soft (whose table has none) the
// entry it stands for.
type sparseContext struct {
	verbs.Context
	p *provider
}

func (c *sparseContext) AllocPD() (verbs.PD, error) {
	pd, err := c.Context.AllocPD()
	if err != nil {
		return nil, err
	}
	return &sparsePD{PD: pd, p: c.p}, nil
}

type sparsePD struct {
	verbs.PD
	p *provider
}

func (pd *sparsePD) CreateQP(attr verbs.QPInitAttr) (verbs.QP, error) {
	qp, err := pd.PD.CreateQP(attr)
	if err != nil {
		return nil, err
	}
	return &sparseQP{QP: qp, p: pd.p}, nil
}

type sparseQP struct {
	verbs.QP
	p *provider
}

func (q *sparseQP) ToRTR(attr verbs.RTRAttr) error {
	q.p.mu.Lock()
	q.p.sgidIndex = append(q.p.sgidIndex, attr.Dest.SGIDIndex)
	q.p.mu.Unlock()
	idx, ok := q.p.toSoft[int(attr.Dest.SGIDIndex)]
	if !ok {
		idx = 255 // no such entry: soft refuses it
	}
	attr.Dest.SGIDIndex = idx
	return q.QP.ToRTR(attr)
}

// TestSparseGIDTable connects over a device whose GID table has holes: 127.0.0.1 sits
// at hardware index 5, the third populated entry. The QPs must name index 5, and data
// must move.
func TestSparseGIDTable(t *testing.T) {
	f := soft.New(soft.Options{})
	real, err := f.Devices()
	require.NoError(t, err)
	gids := real[0].Ports[0].GIDs // soft0: 0 link-local, 1 127.0.0.1
	require.Equal(t, loopback, gids[1].GID.Addr())
	p := &provider{
		Fabric: f,
		table: []verbs.GIDEntry{
			{Index: 0, GID: gids[0].GID, Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
			{Index: 2, GID: gidOf("::ffff:10.0.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
			{Index: 5, GID: gids[1].GID, Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
		},
		toSoft: map[int]uint8{0: 0, 5: 1},
	}

	ca, cb := tcpPair(t)
	ea, err := Prepare(p, loopback, Options{})
	require.NoError(t, err)
	eb, err := Prepare(p, loopback, Options{})
	require.NoError(t, err)
	require.Equal(t, gids[1].GID, ea.Offer().GID)
	a, err := ea.Connect(eb.Offer(), ca, 0)
	require.NoError(t, err)
	b, err := eb.Connect(ea.Offer(), cb, 0)
	require.NoError(t, err)
	startPair(t, a, b)
	require.Equal(t, []uint8{5, 5}, p.sgidIndex, "SGIDIndex of the two QPs")

	msg := []byte("across a table with holes")
	go a.Write(msg)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(b, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestGIDPerConnection prepares two endpoints on one device from two local addresses:
// they share the device but each offers the GID of its own address.
func TestGIDPerConnection(t *testing.T) {
	f := soft.New(soft.Options{})
	real, err := f.Devices()
	require.NoError(t, err)
	gids := real[0].Ports[0].GIDs
	p := &provider{Fabric: f, table: append(slices.Clone(gids),
		verbs.GIDEntry{Index: 4, GID: gidOf("::ffff:10.0.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"})}

	e1, err := Prepare(p, loopback, Options{})
	require.NoError(t, err)
	e2, err := Prepare(p, netip.MustParseAddr("10.0.0.1"), Options{})
	require.NoError(t, err)
	require.Same(t, e1.dev, e2.dev, "one device for both")
	require.Equal(t, gids[1].GID, e1.Offer().GID, "the GID of 127.0.0.1")
	require.Equal(t, gidOf("::ffff:10.0.0.1"), e2.Offer().GID, "the GID of 10.0.0.1")
	require.Equal(t, 4, e2.path.gid.Index)
	require.NoError(t, e1.Abort())
	require.NoError(t, e2.Abort())
	requireReleased(t, f)
}

// TestDeviceListingShared starts many preparations on a cold cache while the listing
// is held: they all wait for one listing, and the device is opened once.
func TestDeviceListingShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := soft.New(soft.Options{})
		p := &provider{Fabric: f, gate: make(chan struct{}), gateOn: "devices"}
		const n = 200
		eps := make([]*Endpoint, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { eps[i], errs[i] = Prepare(p, loopback, Options{RingSize: MinRingSize, SendBufferSize: 1024}) })
		}
		synctest.Wait() // every caller is waiting for the listing
		require.Equal(t, int64(1), p.lists.Load(), "listings started by %d callers", n)
		close(p.gate)
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			require.Same(t, eps[0].dev, eps[i].dev)
		}
		require.Equal(t, 1, f.Stats().Contexts, "device contexts")
		// Within the cache's lifetime nobody lists again; after it, the next caller does.
		e, err := Prepare(p, loopback, Options{})
		require.NoError(t, err)
		require.NoError(t, e.Abort())
		require.Equal(t, int64(1), p.lists.Load())
		time.Sleep(attrCacheTTL) // synctest's clock: the cache expires at once
		e, err = Prepare(p, loopback, Options{})
		require.NoError(t, err)
		require.NoError(t, e.Abort())
		require.Equal(t, int64(2), p.lists.Load())
		for _, ep := range eps {
			require.NoError(t, ep.Abort())
		}
		requireReleased(t, f)
	})
}

// TestPrepareHonoursContext holds the device listing, then the device opening, and
// checks that PrepareContext returns when its context ends, with the context's error,
// and that the device opened for nobody is closed afterwards.
func TestPrepareHonoursContext(t *testing.T) {
	for _, step := range []string{"devices", "open"} {
		t.Run(step, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := soft.New(soft.Options{})
				p := &provider{Fabric: f, gate: make(chan struct{}), gateOn: step}

				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				start := time.Now()
				_, err := PrepareContext(ctx, p, loopback, Options{})
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.Equal(t, time.Second, time.Since(start), "returned at the deadline")

				ctx, cancel = context.WithCancel(t.Context())
				done := make(chan error)
				go func() {
					_, err := PrepareContext(ctx, p, loopback, Options{})
					done <- err
				}()
				synctest.Wait()
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)

				close(p.gate) // the step completes for nobody
				synctest.Wait()
				requireReleased(t, f)
				devices.Lock()
				_, open := devices.open[deviceKey{provider: p, name: "soft0"}]
				devices.Unlock()
				require.False(t, open, "a device nobody holds stays in the table")

				// The next preparation works.
				e, err := PrepareContext(t.Context(), p, loopback, Options{})
				require.NoError(t, err)
				require.NoError(t, e.Abort())
				requireReleased(t, f)
			})
		})
	}
}
