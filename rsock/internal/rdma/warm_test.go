package rdma

import (
	"net/netip"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// closeIdleOf closes the idle devices of fabric f, whether tests use it directly or
// through a wrapper that embeds it.
func closeIdleOf(t testing.TB, f *soft.Fabric) {
	t.Helper()
	require.NoError(t, closeIdle(func(p verbs.Provider) bool { return fabricOf(p) == f }))
}

// fabricOf returns the soft fabric p is or embeds (as a field named Fabric), or nil.
func fabricOf(p verbs.Provider) *soft.Fabric {
	if f, ok := p.(*soft.Fabric); ok {
		return f
	}
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	if fv := v.Elem().FieldByName("Fabric"); fv.IsValid() && fv.CanInterface() {
		f, _ := fv.Interface().(*soft.Fabric)
		return f
	}
	return nil
}

// TestDeviceStaysWarm releases a device's last endpoint: the device stays open with one
// CQ and no goroutine (synctest would find a parked one at the end), the next endpoint
// reuses it without listing devices or creating a CQ, and it closes deviceIdleTimeout after
// its last endpoint, not before.
func TestDeviceStaysWarm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := soft.New(soft.Options{})
		p := &provider{Fabric: f}
		e, err := Prepare(p, loopback, Options{})
		require.NoError(t, err)
		dev := e.dev
		require.NoError(t, e.Abort())
		s := f.Stats()
		require.Equal(t, 1, s.Contexts, "contexts while idle: %+v", s)
		require.Equal(t, 1, s.CQs, "CQs while idle: %+v", s)
		require.Zero(t, s.QPs, "QPs while idle: %+v", s)
		require.Equal(t, 1, s.PDs, "PDs while idle: the pooled shell's (pool.go): %+v", s)
		require.Equal(t, 2, s.MRs, "MRs while idle: the pooled shell's ring and send buffer: %+v", s)

		time.Sleep(attrCacheTTL / 2) // within the listing's lifetime too
		e, err = Prepare(p, loopback, Options{})
		require.NoError(t, err)
		require.Same(t, dev, e.dev, "the warm device")
		require.Equal(t, int64(1), p.lists.Load(), "device listings")
		require.Equal(t, 1, f.Stats().CQs, "CQs in use")

		time.Sleep(deviceIdleTimeout) // in use: the first idle period's timer is void
		require.Equal(t, 1, f.Stats().Contexts, "contexts in use")
		require.NoError(t, e.Abort())

		time.Sleep(deviceIdleTimeout - time.Nanosecond)
		require.Equal(t, 1, f.Stats().Contexts, "contexts just before the idle timeout")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		requireReleasedNow(t, f)
	})
}

// TestIdleDevicesBounded leaves one more idle device than maxIdleDevices: the one idle
// the longest closes at once, the others stay until CloseIdle.
func TestIdleDevicesBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fabs := make([]*soft.Fabric, maxIdleDevices+1)
		for i := range fabs {
			fabs[i] = soft.New(soft.Options{})
			e, err := Prepare(fabs[i], loopback, Options{})
			require.NoError(t, err)
			require.NoError(t, e.Abort())
			time.Sleep(time.Millisecond) // one after the other
		}
		require.Zero(t, fabs[0].Stats().Contexts, "the device idle the longest")
		for i, f := range fabs[1:] {
			require.Equal(t, 1, f.Stats().Contexts, "device %d", i+1)
		}
		for _, f := range fabs[1:] {
			require.NoError(t, CloseIdle(f))
			requireReleasedNow(t, f)
		}
	})
}

// TestIdleDeviceKeepsOneCQ fills a first CQ so that a second connection needs its own:
// once both are released, the device keeps one CQ.
func TestIdleDeviceKeepsOneCQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := soft.New(soft.Options{})
		opts := Options{CQSize: DefaultSendWQEs + DefaultRecvWQEs + 1} // one endpoint per CQ
		e1, err := Prepare(f, loopback, opts)
		require.NoError(t, err)
		e2, err := Prepare(f, loopback, opts)
		require.NoError(t, err)
		require.Equal(t, 2, f.Stats().CQs, "CQs in use")
		require.NoError(t, e1.Abort())
		require.NoError(t, e2.Abort())
		require.Equal(t, 1, f.Stats().CQs, "CQs while idle")
		require.NoError(t, CloseIdle(f))
		requireReleasedNow(t, f)
	})
}

// requireReleasedNow checks, without closing idle devices, that f holds nothing.
func requireReleasedNow(t *testing.T, f *soft.Fabric) {
	t.Helper()
	s := f.Stats()
	require.Zero(t, s.QPs+s.MRs+s.CQs+s.PDs+s.Contexts+s.CompChannels, "soft resources left: %+v", s)
}

// TestWarm follows a provider from cold (nothing listed or open) to warm (listed, device
// open, in use or idle) and back.
func TestWarm(t *testing.T) {
	f := soft.New(soft.Options{})
	require.False(t, Warm(f, loopback, Options{}), "cold")
	e, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	require.True(t, Warm(f, loopback, Options{}), "in use")
	require.False(t, Warm(f, netip.MustParseAddr("192.0.2.1"), Options{}), "an address no device serves")
	require.NoError(t, e.Abort())
	require.True(t, Warm(f, loopback, Options{}), "idle")
	require.NoError(t, CloseIdle(f))
	require.False(t, Warm(f, loopback, Options{}), "closed")
	requireReleased(t, f)
}

// TestCool cools a provider with one device in use: the device closes with its last
// endpoint instead of going idle, and the next endpoint warms the provider again.
func TestCool(t *testing.T) {
	f := soft.New(soft.Options{})
	e, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	require.NoError(t, Cool(f))
	require.Equal(t, 1, f.Stats().Contexts, "the device in use stays open")
	require.NoError(t, e.Abort())
	requireReleasedNow(t, f)
	devices.Lock()
	require.NotContains(t, idleDevices.cooled, verbs.Provider(f), "the record outlives the devices")
	devices.Unlock()

	e, err = Prepare(f, loopback, Options{})
	require.NoError(t, err)
	require.NoError(t, e.Abort())
	require.Equal(t, 1, f.Stats().Contexts, "warm again after a new endpoint")
	require.NoError(t, Cool(f))
	requireReleasedNow(t, f)
}

// TestDeviceStaysWarmOnFake: a device nobody uses stays open for deviceIdleTimeout
// after its last endpoint is released, so that the next one reuses it, and each release
// starts the idle period afresh; then it closes. Its time is synctest's: the sleeps
// advance the bubble's clock.
func TestDeviceStaysWarmOnFake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFakeProvider()
		ep, err := Prepare(p, loopback, Options{})
		require.NoError(t, err)
		require.NoError(t, ep.Abort())
		require.True(t, Warm(p, loopback, Options{}), "just released")
		ctx := p.context(0)

		time.Sleep(deviceIdleTimeout - time.Second)
		synctest.Wait()
		require.False(t, ctx.isClosed(), "closed within the idle timeout")
		ep, err = Prepare(p, loopback, Options{})
		require.NoError(t, err)
		_, _, opens := p.counts()
		require.Equal(t, 1, opens, "the warm device was not reused")
		require.NoError(t, ep.Abort())

		time.Sleep(deviceIdleTimeout - time.Second) // past the first idle period's end
		synctest.Wait()
		require.False(t, ctx.isClosed(), "closed at the end of an idle period a reuse ended")
		time.Sleep(time.Second)
		synctest.Wait()
		require.True(t, ctx.isClosed(), "open after the idle timeout")
		require.False(t, Warm(p, loopback, Options{}))
		requireFakeReleased(t, p)
	})
}

// TestIdleDevicesBoundedOnFake: at most maxIdleDevices devices stay warm; one more
// going idle closes the one idle the longest.
func TestIdleDevicesBoundedOnFake(t *testing.T) {
	require.NoError(t, CloseIdle(nil)) // other tests' devices do not count
	ps := make([]*fakeProvider, maxIdleDevices+1)
	for i := range ps {
		ps[i] = newFakeProvider()
		ep, err := Prepare(ps[i], loopback, Options{})
		require.NoError(t, err)
		require.NoError(t, ep.Abort())
	}
	require.True(t, ps[0].context(0).isClosed(), "the longest idle device is open")
	for i, p := range ps[1:] {
		require.False(t, p.context(0).isClosed(), "idle device %d closed", i+1)
	}
	for _, p := range ps {
		requireFakeReleased(t, p)
	}
}

// TestIdleDeviceKeepsOneCQOnFake: an idle device keeps one CQ and its channel, and
// closes the others.
func TestIdleDeviceKeepsOneCQOnFake(t *testing.T) {
	p := newFakeProvider()
	opts := Options{CQSize: 129} // one endpoint's 64+64+1 entries per CQ
	var eps []*Endpoint
	for range 3 {
		ep, err := Prepare(p, loopback, opts)
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	live, _, _ := p.counts()
	require.Equal(t, 3, live.CQs, "CQs of three endpoints that fill one each")
	for _, ep := range eps {
		require.NoError(t, ep.Abort())
	}
	live, _, _ = p.counts()
	require.Equal(t, fakeCounts{Contexts: 1, CQs: 1, Chans: 1}, live, "idle")
	requireFakeReleased(t, p)
}

// TestCoolOnFake: a device cooled while in use closes with its last endpoint instead
// of staying warm; the next endpoint opens it again, and it stays warm after that one.
func TestCoolOnFake(t *testing.T) {
	p := newFakeProvider()
	ep, err := Prepare(p, loopback, Options{})
	require.NoError(t, err)
	require.NoError(t, Cool(p))
	require.False(t, p.context(0).isClosed(), "cooling closed a device in use")
	require.NoError(t, ep.Abort())
	require.True(t, p.context(0).isClosed(), "a cooled device stayed warm")
	devices.Lock()
	cooled := idleDevices.cooled[p]
	devices.Unlock()
	require.False(t, cooled, "a provider with no device left is still remembered as cooled")

	ep, err = Prepare(p, loopback, Options{})
	require.NoError(t, err)
	require.NoError(t, ep.Abort())
	_, _, opens := p.counts()
	require.Equal(t, 2, opens)
	require.False(t, p.context(1).isClosed(), "warm again after a new use")
	requireFakeReleased(t, p)
}
