//go:build !race

package rdma

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestSteadyStateAllocs checks that steady-state Write and Read allocate nothing, on
// soft and, where this build has one and the machine a device (built with -tags rdma,
// in the Soft-RoCE VM), on the default provider: a completion wait that allocated
// showed only there. testing.AllocsPerRun counts every goroutine's allocations, so
// the pollers and the peer's goroutine are included.
func TestSteadyStateAllocs(t *testing.T) {
	type prov struct {
		name string
		p    verbs.Provider
		f    *soft.Fabric // for the release check, or nil
	}
	f := soft.New(soft.Options{})
	provs := []prov{{"soft", f, f}}
	if p, err := auto.Default(); err == nil {
		provs = append(provs, prov{"default-" + p.Name(), p, nil})
	} else {
		t.Logf("no default provider here, soft only: %v", err)
	}
	const size = 64 << 10
	for _, pv := range provs {
		t.Run(pv.name, func(t *testing.T) {
			pair := func(t *testing.T) (*Conn, *Conn) {
				ca, cb := tcpPair(t)
				ea, err := Prepare(pv.p, loopback, Options{})
				require.NoError(t, err, "prepare on %s at %v (the device must hold a GID for it)", pv.name, loopback)
				eb, err := Prepare(pv.p, loopback, Options{})
				require.NoError(t, err)
				a, err := ea.Connect(eb.Offer(), ca, 0)
				require.NoError(t, err)
				b, err := eb.Connect(ea.Offer(), cb, 0)
				require.NoError(t, err)
				a.Start()
				b.Start()
				return a, b
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
			if pv.f != nil {
				requireReleased(t, pv.f)
			}
		})
	}
}
