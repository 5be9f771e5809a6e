// Package allocguard holds the steady-state allocation checks that several packages
// run on their connections (the RDMA engine's Conn, rsock's Conn): a one-way stream and
// a ping-pong, each measured with testing.AllocsPerRun, which counts every goroutine's
// allocations (the peer's, the pollers', the control channel's) and so catches an
// allocation anywhere on the data path, not only in the caller's.
//
// Callers build without the race detector: its instrumentation allocates.
package allocguard

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// SteadyState runs the subtests "stream" and "ping-pong" with size-byte messages, each on
// a fresh connection from pair, and requires zero allocations per Write (stream) and per
// round trip (ping-pong). Both ends are closed before it returns.
func SteadyState(t *testing.T, size int, pair func(t *testing.T) (net.Conn, net.Conn)) {
	t.Run("stream", func(t *testing.T) {
		w, r := pair(t)
		done := serve(r, size, false)
		buf := make([]byte, size)
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := w.Write(buf); err != nil {
				panic(err)
			}
		})
		require.NoError(t, w.Close())
		<-done
		require.NoError(t, r.Close())
		require.Zero(t, allocs, "allocations per %d-byte Write and Read", size)
	})

	t.Run("ping-pong", func(t *testing.T) {
		a, b := pair(t)
		done := serve(b, size, true)
		buf := make([]byte, size)
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := a.Write(buf); err != nil {
				panic(err)
			}
			if _, err := io.ReadFull(a, buf); err != nil {
				panic(err)
			}
		})
		require.NoError(t, a.Close())
		<-done
		require.NoError(t, b.Close())
		require.Zero(t, allocs, "allocations per %d-byte round trip", size)
	})
}

// serve reads size-byte messages from c until an error, echoing each back if echo is
// set; the returned channel closes when it stops.
func serve(c net.Conn, size int, echo bool) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if echo {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}
	}()
	return done
}
