package rdma

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/soft"
)

func gidOf(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }

// provider wraps a soft fabric: Devices and Open can be held at a gate, counted, and
// the device list edited (to describe what soft does not model, such as iWARP).
type provider struct {
	*soft.Fabric
	gate   chan struct{} // nil: no gate; else Devices and Open wait for it to close
	gateOn string        // "devices" or "open"
	lists  atomic.Int64  // Devices calls
	edit   func([]verbs.DeviceAttr)
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
	if err == nil && p.edit != nil {
		p.edit(attrs)
	}
	return attrs, err
}

func (p *provider) Open(name string) (verbs.Context, error) {
	p.wait("open")
	return p.Fabric.Open(name)
}

// holes is soft0's GID table in the tests below, as a kernel leaves it when addresses
// were deleted: 127.0.0.1 at hardware index 5, the third populated entry; 10.0.0.1 at
// index 2, the second.
var holes = []verbs.GIDEntry{
	{Index: 0, GID: verbs.GID{0xfe, 0x80, 15: 1}, Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
	{Index: 2, GID: gidOf("::ffff:10.0.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
	{Index: 5, GID: gidOf("::ffff:127.0.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
}

// moveVerified writes n random bytes from a to b and checks that they arrive.
func moveVerified(t *testing.T, a, b *Conn, n int) {
	t.Helper()
	msg := make([]byte, n)
	rand.Read(msg)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Write(msg)
		errc <- err
	}()
	got := make([]byte, n)
	_, err := io.ReadFull(b, got)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.True(t, bytes.Equal(msg, got), "the bytes read differ from the bytes written")
}

// TestSparseGIDTable connects over a soft device whose GID table has holes. The QPs must
// name hardware index 5, the entry holding 127.0.0.1: soft, like a kernel device, drops
// requests sent from any other GID (position 2 would name 10.0.0.1), so data moves only
// if the index is right.
func TestSparseGIDTable(t *testing.T) {
	// At real time: a time scale would shrink the engine's retry budget (8 tries of
	// 67 ms) below what a loaded machine may take to answer, and fail a good path.
	f := soft.New(soft.Options{Ports: []soft.PortConfig{{GIDs: holes}}})
	ea, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	eb, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	require.Equal(t, 5, ea.path.gid.Index, "source GID index")
	require.Equal(t, gidOf("::ffff:127.0.0.1"), ea.Offer().GID)
	ca, cb := tcpPair(t)
	a, err := ea.Connect(eb.Offer(), ca, 0)
	require.NoError(t, err)
	b, err := eb.Connect(ea.Offer(), cb, 0)
	require.NoError(t, err)
	startPair(t, a, b)
	moveVerified(t, a, b, 64<<10)
	moveVerified(t, b, a, 64<<10)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestGIDPerConnection prepares two endpoints on one device from two local addresses:
// they share the device but each offers the GID of its own address.
func TestGIDPerConnection(t *testing.T) {
	f := soft.New(soft.Options{Ports: []soft.PortConfig{{GIDs: holes}}})
	e1, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	e2, err := Prepare(f, netip.MustParseAddr("10.0.0.1"), Options{})
	require.NoError(t, err)
	require.Same(t, e1.dev, e2.dev, "one device for both")
	require.Equal(t, gidOf("::ffff:127.0.0.1"), e1.Offer().GID, "the GID of 127.0.0.1")
	require.Equal(t, gidOf("::ffff:10.0.0.1"), e2.Offer().GID, "the GID of 10.0.0.1")
	require.Equal(t, 2, e2.path.gid.Index)
	require.NoError(t, e1.Abort())
	require.NoError(t, e2.Abort())
	requireReleased(t, f)
}

// testNetdev is the interface whose GIDs TestEveryLocalGID tries on the default
// provider: $RSOCK_TEST_NETDEV, or this host's loopback interface.
func testNetdev(t *testing.T) string {
	if name := os.Getenv("RSOCK_TEST_NETDEV"); name != "" {
		return name
	}
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 {
			return ifc.Name
		}
	}
	return "lo"
}

// TestEveryLocalGID connects, from each IPv4 RoCE v2 GID of an active port on one
// interface of this host, a pair of endpoints that both use it (the device loops the
// packets back), and checks that the source GID index is the entry's hardware index and
// that data moves. It runs on soft, with a table with holes on "lo" (127.0.0.1 at 5,
// 127.0.0.9 at 9, 127.0.0.3 deleted), and on the default provider where the build and
// the machine have one, with the GIDs of testNetdev's interface: in the Soft-RoCE VM,
// .ci/rxe-guest/select.sh makes a table with holes on a device of its own and checks
// the index logged for the highest address against sysfs.
func TestEveryLocalGID(t *testing.T) {
	type prov struct {
		name string
		p    verbs.Provider
		f    *soft.Fabric
	}
	// At real time, as in TestSparseGIDTable: at 0.001 the retry budget was half a
	// millisecond, and under -race on a busy machine a Close failed with "transport
	// retry counter exceeded".
	f := soft.New(soft.Options{Ports: []soft.PortConfig{{GIDs: append(slices.Clone(holes),
		verbs.GIDEntry{Index: 9, GID: gidOf("::ffff:127.0.0.9"), Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
		verbs.GIDEntry{Index: 8, GID: gidOf("::ffff:127.0.0.9"), Type: verbs.GIDTypeRoCEv1, Netdev: "lo"},
	)}}})
	provs := []prov{{"soft", f, f}}
	if p, err := auto.Default(); err == nil {
		provs = append(provs, prov{"default-" + p.Name(), p, nil})
	} else {
		t.Logf("no default provider here, soft only: %v", err)
	}
	netdev := testNetdev(t)
	for _, pv := range provs {
		t.Run(pv.name, func(t *testing.T) {
			devs, err := pv.p.Devices()
			require.NoError(t, err)
			tried := 0
			for _, d := range devs {
				for _, port := range d.Ports {
					if port.State != verbs.PortActive || port.LinkLayer != verbs.LinkLayerEthernet {
						continue
					}
					for pos, g := range port.GIDs {
						want := netdev
						if pv.f != nil {
							want = "lo"
						}
						if g.Netdev != want || g.Type != verbs.GIDTypeRoCEv2 || !g.GID.Addr().Is4() || g.Index > verbs.MaxGIDIndex {
							continue
						}
						ip := g.GID.Addr()
						a, b := connPairIPs(t, pv.p, ip.String(), ip.String(), Options{RingSize: 16 << 10, SendBufferSize: 8 << 10})
						t.Logf("%s port %d: %v at GID index %d (position %d among the populated entries)", d.Name, port.Num, ip, a.ep.path.gid.Index, pos)
						require.Equal(t, g.Index, a.ep.path.gid.Index, "source GID index of %v", ip)
						require.Equal(t, g.GID, a.ep.path.gid.GID)
						moveVerified(t, a, b, 256<<10)
						moveVerified(t, b, a, 256<<10)
						require.NoError(t, a.Close())
						require.NoError(t, b.Close())
						tried++
					}
				}
			}
			t.Logf("%d addresses tried", tried)
			if pv.f != nil {
				require.Equal(t, 2, tried, "soft's 127.0.0.1 and 127.0.0.9")
				requireReleased(t, pv.f)
			}
		})
	}
}

// TestSelectIBByNetdev gives two soft devices InfiniBand ports whose IPoIB interfaces
// are ib0 and ib1 (two HCAs, each possibly its own fabric): a connection from ib1's
// address uses soft1, not the first active InfiniBand port, at its lowest GID.
func TestSelectIBByNetdev(t *testing.T) {
	ibPort := func(netdev string, gids ...verbs.GIDEntry) soft.PortConfig {
		return soft.PortConfig{LinkLayer: verbs.LinkLayerInfiniBand, LID: 3, Netdevs: []string{netdev}, GIDs: gids}
	}
	f := soft.New(soft.Options{Devices: 2, Ports: []soft.PortConfig{
		ibPort("ib0", verbs.GIDEntry{Index: 0, GID: gidOf("fe80::2:c903:1:1")}),
		ibPort("ib1", verbs.GIDEntry{Index: 4, GID: gidOf("fe80::2:c903:2:9")}, verbs.GIDEntry{Index: 2, GID: gidOf("fe80::2:c903:2:1")}),
	}})
	opts := Options{netdevOf: func(ip netip.Addr) (string, error) {
		return map[string]string{"192.168.0.1": "ib0", "192.168.1.1": "ib1"}[ip.String()], nil
	}}
	a, b := connPairIPs(t, f, "192.168.1.1", "192.168.1.1", opts)
	require.Equal(t, "soft1", a.ep.dev.key.name)
	require.Equal(t, 2, a.ep.path.gid.Index, "the lowest populated GID")
	require.Equal(t, uint16(3), a.ep.Offer().LID)
	moveVerified(t, a, b, 64<<10)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())

	e, err := Prepare(f, netip.MustParseAddr("192.168.0.1"), opts)
	require.NoError(t, err)
	require.Equal(t, "soft0", e.dev.key.name)
	require.NoError(t, e.Abort())

	_, err = Prepare(f, netip.MustParseAddr("192.168.2.1"), opts)
	require.ErrorIs(t, err, verbs.ErrNoDevice)
	require.ErrorContains(t, err, "InfiniBand ports serve the addresses of their IPoIB interfaces: soft0 port 1 (ib0), soft1 port 1 (ib1)")
	requireReleased(t, f)
}

// TestSelectLinkLocalZone gives two soft devices the same link-local address, on eth0
// and eth1: the zone of the connection's address picks the device.
func TestSelectLinkLocalZone(t *testing.T) {
	ll := gidOf("fe80::5054:ff:fe12:3456")
	port := func(netdev string) soft.PortConfig {
		return soft.PortConfig{GIDs: []verbs.GIDEntry{{Index: 0, GID: ll, Type: verbs.GIDTypeRoCEv2, Netdev: netdev}}}
	}
	f := soft.New(soft.Options{Devices: 2, Ports: []soft.PortConfig{port("eth0"), port("eth1")}})
	for _, tt := range []struct{ ip, dev string }{
		{"fe80::5054:ff:fe12:3456%eth0", "soft0"},
		{"fe80::5054:ff:fe12:3456%eth1", "soft1"},
	} {
		e, err := Prepare(f, netip.MustParseAddr(tt.ip), Options{})
		require.NoError(t, err, tt.ip)
		require.Equal(t, tt.dev, e.dev.key.name, "device for %s", tt.ip)
		require.Equal(t, ll, e.Offer().GID)
		require.NoError(t, e.Abort())
	}
	_, err := Prepare(f, netip.MustParseAddr("fe80::5054:ff:fe12:3456%eth2"), Options{})
	require.ErrorIs(t, err, verbs.ErrNoDevice)
	require.ErrorContains(t, err, "soft0 port 1 holds it on eth0, not on eth2")
	requireReleased(t, f)
}

// TestPrepareRefusesIWARP lists the soft device as an iWARP RNIC: no endpoint is
// prepared, and the error says why.
func TestPrepareRefusesIWARP(t *testing.T) {
	f := soft.New(soft.Options{})
	p := &provider{Fabric: f, edit: func(d []verbs.DeviceAttr) { d[0].Transport = verbs.TransportIWARP }}
	_, err := Prepare(p, loopback, Options{})
	require.ErrorIs(t, err, verbs.ErrNoDevice)
	require.EqualError(t, err, "verbs: no RDMA port serves 127.0.0.1: soft0 holds it but is an iWARP device, which has no RDMA write with immediate")
	requireReleased(t, f)
}

// TestPrepareRoCEVersion prefers RoCE v1 where the address has both entries.
func TestPrepareRoCEVersion(t *testing.T) {
	ip := gidOf("::ffff:127.0.0.1")
	f := soft.New(soft.Options{Ports: []soft.PortConfig{{GIDs: []verbs.GIDEntry{
		{Index: 6, GID: ip, Type: verbs.GIDTypeRoCEv1, Netdev: "lo"},
		{Index: 7, GID: ip, Type: verbs.GIDTypeRoCEv2, Netdev: "lo"},
	}}}})
	for _, tt := range []struct {
		pref int // Options.RoCEVersion
		want int
	}{{0, 7}, {2, 7}, {1, 6}} {
		e, err := Prepare(f, loopback, Options{RoCEVersion: tt.pref})
		require.NoError(t, err)
		require.Equal(t, tt.want, e.path.gid.Index, "GID index with preference %v", tt.pref)
		require.NoError(t, e.Abort())
	}
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

// TestSelectDeviceOnFake: Prepare uses the device and port that serve the local
// address, among several, and opens nothing when none does.
func TestSelectDeviceOnFake(t *testing.T) {
	other := netip.MustParseAddr("192.0.2.1")
	down := fakeDevice("down0", loopback)
	down.Ports[0].State = verbs.PortDown
	tests := []struct {
		name     string
		devs     []verbs.DeviceAttr
		ip       netip.Addr
		wantDev  string
		wantText string // in the error, when no device serves ip
	}{
		{name: "the one device", devs: []verbs.DeviceAttr{fakeDevice("fake0", loopback)}, ip: loopback, wantDev: "fake0"},
		{name: "the second of two", devs: []verbs.DeviceAttr{fakeDevice("fake0", other), fakeDevice("fake1", loopback)},
			ip: loopback, wantDev: "fake1"},
		{name: "the first of two", devs: []verbs.DeviceAttr{fakeDevice("fake0", other), fakeDevice("fake1", loopback)},
			ip: other, wantDev: "fake0"},
		{name: "an address nobody serves", devs: []verbs.DeviceAttr{fakeDevice("fake0", other)}, ip: loopback,
			wantText: "127.0.0.1"},
		{name: "the port is down", devs: []verbs.DeviceAttr{down}, ip: loopback, wantText: "down0 port 1 holds it but is"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeProvider(tt.devs...)
			ep, err := Prepare(p, tt.ip, Options{})
			if tt.wantText != "" {
				require.ErrorContains(t, err, tt.wantText)
				_, _, opens := p.counts()
				require.Zero(t, opens, "devices opened")
				requireFakeReleased(t, p)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantDev, ep.dev.attr.Name)
			require.Equal(t, tt.wantDev, p.context(0).attr.Name, "the device opened")
			require.Equal(t, verbs.GIDFromAddr(tt.ip), ep.Offer().GID)
			require.NoError(t, ep.Abort())
			requireFakeReleased(t, p)
		})
	}
}

// TestAcquireDeviceSharedOnFake: endpoints prepared at once, while the devices are
// being listed and then opened, share one listing and one opening; each holds a reference, and the device
// outlives all but the last.
func TestAcquireDeviceSharedOnFake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFakeProvider()
		listGate, openGate := make(chan struct{}), make(chan struct{})
		p.listGate, p.openGate = listGate, openGate
		const n = 3
		eps := make(chan *Endpoint, n)
		for range n {
			go func() {
				ep, err := Prepare(p, loopback, Options{})
				if err != nil {
					t.Error(err)
				}
				eps <- ep
			}()
		}
		synctest.Wait() // every Prepare waits for the one listing
		close(listGate)
		synctest.Wait() // every Prepare waits for the one opening
		close(openGate)
		var got []*Endpoint
		for range n {
			got = append(got, <-eps)
		}
		_, listings, opens := p.counts()
		require.Equal(t, 1, listings, "device listings")
		require.Equal(t, 1, opens, "device openings")
		d := got[0].dev
		for _, ep := range got {
			require.Same(t, d, ep.dev)
		}
		devices.Lock()
		require.Equal(t, n, d.refs)
		devices.Unlock()
		for i, ep := range got {
			require.NoError(t, ep.Abort())
			require.False(t, p.context(0).isClosed(), "closed after %d of %d endpoints", i+1, n)
		}
		requireFakeReleased(t, p)
	})
}

// TestPrepareContextEndsOnFake: a Prepare whose context ends while the device is being
// opened returns the context's error at once; the opening completes for nobody, and the
// device is closed then, not kept.
func TestPrepareContextEndsOnFake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFakeProvider()
		gate := make(chan struct{})
		p.openGate = gate
		ctx, cancel := context.WithCancel(context.Background())
		errs := make(chan error, 1)
		go func() {
			_, err := PrepareContext(ctx, p, loopback, Options{})
			errs <- err
		}()
		synctest.Wait()
		cancel()
		require.ErrorIs(t, <-errs, context.Canceled)
		close(gate)
		synctest.Wait() // the opening completes
		live, _, opens := p.counts()
		require.Equal(t, 1, opens)
		require.Zero(t, live, "an opening nobody waited for left")
		devices.Lock()
		_, kept := devices.open[deviceKey{provider: p, name: "fake0"}]
		devices.Unlock()
		require.False(t, kept, "the device stays in the table")
	})
}

// TestUncomparableProvider: a provider that cannot be a map key is refused, not a panic.
func TestUncomparableProvider(t *testing.T) {
	type uncomparable struct {
		*fakeProvider
		_ []int
	}
	_, err := Prepare(uncomparable{fakeProvider: newFakeProvider()}, loopback, Options{})
	require.ErrorContains(t, err, "not comparable")
}
