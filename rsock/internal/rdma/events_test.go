package rdma

import (
	"context"
	"errors"
	"io"
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
