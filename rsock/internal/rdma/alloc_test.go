//go:build !race

package rdma

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/allocguard"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// allocProvider is a provider an allocation test runs on.
type allocProvider struct {
	name string
	p    verbs.Provider
	f    *soft.Fabric // for the release check, or nil
}

// withDefaultProvider is the providers given and, where this build has one and the
// machine a device (built with -tags rdma, in the Soft-RoCE VM), the default provider
// after them.
func withDefaultProvider(t *testing.T, given ...allocProvider) []allocProvider {
	p, err := auto.Default()
	if err != nil {
		t.Logf("no default provider here, %d given only: %v", len(given), err)
		return given
	}
	return append(given, allocProvider{"default-" + p.Name(), p, nil})
}

// TestSteadyStateAllocs checks that steady-state Write and Read allocate nothing, on
// soft, on shm and, where this build has one and the machine a device (built with
// -tags rdma, in the Soft-RoCE VM), on the default provider: a completion wait that
// allocated showed only there. testing.AllocsPerRun counts every goroutine's
// allocations, so the pollers and the peer's goroutine are included.
func TestSteadyStateAllocs(t *testing.T) {
	f := soft.New(soft.Options{})
	sp, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() {
		require.NoError(t, closeIdle(func(p verbs.Provider) bool { return p == sp })) // warm.go
		require.NoError(t, sp.Close())
	}()
	provs := withDefaultProvider(t, allocProvider{"soft", f, f}, allocProvider{"shm", sp, nil})
	const size = 64 << 10
	for _, pv := range provs {
		t.Run(pv.name, func(t *testing.T) {
			pair := func(t *testing.T) (net.Conn, net.Conn) {
				return connPair(t, pv.p, Options{}) // on a device, it must hold a GID for 127.0.0.1
			}

			allocguard.SteadyState(t, size, pair)
			if pv.f != nil {
				requireReleased(t, pv.f)
			}
		})
	}
}

// TestPlacedSteadyStateAllocs is TestSteadyStateAllocs with Reads large enough to be
// placed into (placeMinRead, place.go), on soft, where placement is offered: the
// advertisement, the placed write and the Read's return of it allocate nothing either.
func TestPlacedSteadyStateAllocs(t *testing.T) {
	f := soft.New(soft.Options{})
	var readers []*Conn
	pair := func(t *testing.T) (net.Conn, net.Conn) {
		a, b := connPair(t, f, Options{})
		readers = append(readers, a, b)
		return a, b
	}

	allocguard.SteadyState(t, placeMinRead, pair)
	var placed uint64
	for _, c := range readers {
		placed += c.Stats().Placements
	}
	require.NotZero(t, placed, "Reads placed into")
	requireReleased(t, f)
}
