//go:build !race

package rsock

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestConnSteadyStateAllocs checks that a Conn upgraded to RDMA allocates nothing in
// steady-state Write and Read, over a soft fabric, whichever transport bootstrapped it:
// the public layer must add nothing to the engine's zero (guarded by the engine's own
// TestSteadyStateAllocs). testing.AllocsPerRun counts every goroutine's allocations, so
// the pollers, the control channel and the peer's goroutine are included.
func TestConnSteadyStateAllocs(t *testing.T) {
	const size = 64 << 10
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, f, fab)
			ln := listen(t, scfg)
			pair := func(t *testing.T) (*Conn, *Conn) {
				c, s := pipe(t, ln, ccfg)
				require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
				require.Equal(t, TransportRDMA, s.Transport(), "server: %v", s.FallbackReason())
				return c, s
			}

			t.Run("stream", func(t *testing.T) {
				w, r := pair(t)
				done := make(chan struct{})
				go func() {
					defer close(done)
					buf := make([]byte, size)
					for {
						if _, err := io.ReadFull(r, buf); err != nil {
							return
						}
					}
				}()
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
				done := make(chan struct{})
				go func() {
					defer close(done)
					buf := make([]byte, size)
					for {
						if _, err := io.ReadFull(b, buf); err != nil {
							return
						}
						if _, err := b.Write(buf); err != nil {
							return
						}
					}
				}()
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

			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}
