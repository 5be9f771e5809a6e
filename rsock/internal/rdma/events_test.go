package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// connErrOf returns c's sticky error.
func connErrOf(c *Conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// TestFaultPortDown takes soft1's port down while a pair streams both ways between
// soft0 and soft1: b, on the port that went down, fails with ErrPortDown (it does not
// wait for its retries), a with its QP's retry budget or the lost control channel, and
// the bystander on soft0 carries on. Nothing arrives that was not written.
func TestFaultPortDown(t *testing.T) {
	faultCase(t, func(f *soft.Fabric, a, b *Conn) {
		require.NoError(t, f.SetPortState("soft1", 1, verbs.PortDown))
	}, func(ab, ba direction) {
		requireEndedBy(t, "a→b", ab, ErrPortDown)
		requireEndedBy(t, "b→a", ba, ErrPortDown)
		require.ErrorIs(t, ba.writeErr, ErrPortDown, "b's Write names the port")
		require.Contains(t, ba.writeErr.Error(), "soft1 port 1")
		require.ErrorIs(t, ab.readErr, ErrPortDown, "b's Read names the port")
	})
}

// TestFaultDeviceFatal fails soft1 as a whole (EventDeviceFatal, every QP to ERROR)
// while a pair streams both ways between soft0 and soft1, next to a connection that is
// idle on soft1: all of soft1's connections fail, the bystander on soft0 carries on.
// Which error a connection sees first depends on whether the event or its QP's flush
// reaches it first; TestDeviceFatalFailsEveryConn checks the event alone.
func TestFaultDeviceFatal(t *testing.T) {
	var idle, idlePeer *Conn
	faultCase(t, func(f *soft.Fabric, a, b *Conn) {
		idle, idlePeer = connPairIPs(t, f, "127.0.0.2", "127.0.0.1", Options{})
		require.NoError(t, f.FailDevice("soft1"))
	}, func(ab, ba direction) {
		requireEndedBy(t, "a→b", ab, ErrDeviceFatal, ErrQPFailed, ErrControlLost)
		requireEndedBy(t, "b→a", ba, ErrDeviceFatal, ErrQPFailed, ErrControlLost)
		_, err := idle.Read(make([]byte, 1))
		require.True(t, errors.Is(err, ErrDeviceFatal) || errors.Is(err, ErrQPFailed),
			"the idle connection on soft1: %v", err)
		idle.Close()
		idlePeer.Close()
	})
}

// TestDeviceFatalFailsEveryConn hands a device the fatal event alone (no QP flushed):
// every connection on the device fails with ErrDeviceFatal, at once, including idle
// ones, and the next connection opens the device afresh instead of sharing the failed
// context.
func TestDeviceFatalFailsEveryConn(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	dev := a.ep.dev
	dev.handleEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	for _, c := range []*Conn{a, b} {
		require.ErrorIs(t, connErrOf(c), ErrDeviceFatal)
		_, err := c.Write([]byte("x"))
		require.ErrorIs(t, err, ErrDeviceFatal)
	}
	x, y := connPair(t, f, Options{})
	require.NotSame(t, dev, x.ep.dev, "a device that failed is not shared")
	_, err := x.Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = io.ReadFull(y, buf)
	require.NoError(t, err)
	for _, c := range []*Conn{a, b, x, y} {
		c.Close()
	}
	requireReleased(t, f)
}

// TestPortEventsRefreshListing checks that the engine never uses a port's attributes
// from before a change: a port event drops the cached device listing, a listing is
// reused only while a device is open (and its events listened to), a port taken down
// is not chosen (the connection falls back with ErrNoDevice), and a port that comes
// back is chosen again.
func TestPortEventsRefreshListing(t *testing.T) {
	tests := []struct {
		name  string
		event verbs.AsyncEventType
	}{
		{"GID change", verbs.EventGIDChange},
		{"LID change", verbs.EventLIDChange},
		{"port active", verbs.EventPortActive},
		{"port error", verbs.EventPortErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			ep, err := Prepare(f, loopback, Options{}) // soft0 open: its listing is cached
			require.NoError(t, err)
			defer ep.Abort()
			attrs, err := deviceAttrs(context.Background(), f)
			require.NoError(t, err)
			cached, err := deviceAttrs(context.Background(), f)
			require.NoError(t, err)
			require.Same(t, &attrs[0], &cached[0], "the listing is cached while the device is open")
			ep.dev.handleEvent(verbs.AsyncEvent{Type: tt.event, Port: 1})
			again, err := deviceAttrs(context.Background(), f)
			require.NoError(t, err)
			require.NotSame(t, &attrs[0], &again[0], "%v: the listing was made again", tt.event)
		})
	}

	t.Run("no device open", func(t *testing.T) {
		f := soft.New(soft.Options{})
		attrs, err := deviceAttrs(context.Background(), f)
		require.NoError(t, err)
		again, err := deviceAttrs(context.Background(), f)
		require.NoError(t, err)
		require.NotSame(t, &attrs[0], &again[0], "nobody listens to events: the listing is not reused")
	})

	t.Run("down then up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := soft.New(soft.Options{})
			a, b := pipePairKA(t, f, 0, 0) // keeps soft0 open: its listener sees the events
			require.NoError(t, f.SetPortState("soft0", 1, verbs.PortDown))
			_, err := a.Read(make([]byte, 1))
			require.ErrorIs(t, err, ErrPortDown)
			_, err = Prepare(f, loopback, Options{})
			require.ErrorIs(t, err, verbs.ErrNoDevice, "a port that is down is not chosen")
			require.NoError(t, f.SetPortState("soft0", 1, verbs.PortActive))
			synctest.Wait() // the listener has handled the event
			ep, err := Prepare(f, loopback, Options{})
			require.NoError(t, err, "a port that came back is chosen again")
			require.NoError(t, ep.Abort())
			a.Close()
			b.Close()
			requireReleased(t, f)
		})
	})
}

// fakeConnPair connects an endpoint prepared for ipA to one prepared for ipB, both on
// provider p with opts, over a pipe for the control channel; neither is started. The
// fake QPs complete nothing: with a Linger of -1, Close does not wait for the FIN. The test's cleanup closes
// them, and p's idle devices.
func fakeConnPair(t *testing.T, p *fakeProvider, ipA, ipB netip.Addr, opts Options) (a, b *Conn) {
	t.Helper()
	ea, err := Prepare(p, ipA, opts)
	require.NoError(t, err)
	eb, err := Prepare(p, ipB, opts)
	require.NoError(t, err)
	ca, cb := net.Pipe()
	a, err = ea.Connect(eb.Offer(), ca, 0)
	require.NoError(t, err)
	b, err = eb.Connect(ea.Offer(), cb, 0)
	require.NoError(t, err)
	// After a failed check too, so that no poller or listener outlives the test.
	t.Cleanup(func() { CloseIdle(p) })
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestAsyncEventsOnFake pushes each kind of asynchronous event a device can raise to
// a fake device with two ports, a Conn on each: a port going down fails the Conn on
// that port with ErrPortDown, and only it; a fatal device fails both with
// ErrDeviceFatal and is not reused; a port event drops the cached device listing, so
// that the next Prepare lists again; a QP event is left to the QP's completions.
func TestAsyncEventsOnFake(t *testing.T) {
	second := netip.MustParseAddr("127.0.0.2")
	dev := fakeDevice("fake0", loopback)
	port2 := fakeDevice("fake0", second).Ports[0]
	port2.Num = 2
	dev.Ports = append(dev.Ports, port2)
	tests := []struct {
		name         string
		ev           verbs.AsyncEvent
		wantA, wantB error // the Conns' errors: a is on port 1, b on port 2
		wantRelist   bool
		wantReopen   bool
	}{
		{name: "port 1 down", ev: verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1},
			wantA: ErrPortDown, wantRelist: true},
		{name: "port 2 down", ev: verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 2},
			wantB: ErrPortDown, wantRelist: true},
		{name: "device fatal", ev: verbs.AsyncEvent{Type: verbs.EventDeviceFatal},
			wantA: ErrDeviceFatal, wantB: ErrDeviceFatal, wantRelist: true, wantReopen: true},
		{name: "port active", ev: verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1}, wantRelist: true},
		{name: "GID change", ev: verbs.AsyncEvent{Type: verbs.EventGIDChange, Port: 2}, wantRelist: true},
		{name: "QP fatal", ev: verbs.AsyncEvent{Type: verbs.EventQPFatal, QPN: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := newFakeProvider(dev)
				a, b := fakeConnPair(t, p, loopback, second, Options{Linger: -1})
				require.Equal(t, uint8(1), a.ep.path.port.Num)
				require.Equal(t, uint8(2), b.ep.path.port.Num)
				_, listings, _ := p.counts()
				p.context(0).events.Push(tt.ev)
				synctest.Wait()
				for _, c := range []struct {
					name string
					conn *Conn
					want error
				}{{"a", a, tt.wantA}, {"b", b, tt.wantB}} {
					if c.want == nil {
						require.NoError(t, connErrOf(c.conn), "Conn %s after %v", c.name, tt.ev)
					} else {
						require.ErrorIs(t, connErrOf(c.conn), c.want, "Conn %s after %v", c.name, tt.ev)
					}
				}
				ep, err := Prepare(p, loopback, Options{})
				require.NoError(t, err)
				_, relisted, opens := p.counts()
				require.Equal(t, tt.wantRelist, relisted > listings, "listed again after %v", tt.ev)
				require.Equal(t, tt.wantReopen, opens > 1, "the device opened again after %v", tt.ev)
				require.NoError(t, ep.Abort())
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
				requireFakeReleased(t, p)
			})
		})
	}
}
