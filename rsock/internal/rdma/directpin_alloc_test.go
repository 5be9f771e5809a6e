//go:build !race

package rdma

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestWriteDirectPinnedAllocs checks that direct Writes of directPinMinWrite bytes, the
// least on a provider that pins, whose registrations are counted (directpin.go),
// allocate nothing once the buffer is registered, and that they were direct: on soft
// made to pin, on shm (which registers local memory only, uncounted), and, where this
// build has one and the machine a device (built with -tags rdma, in the Soft-RoCE VM),
// on the default provider, rdma-core's registrations of Go memory included.
func TestWriteDirectPinnedAllocs(t *testing.T) {
	f := soft.New(soft.Options{})
	sp, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, sp.Close()) }()
	provs := withDefaultProvider(t, allocProvider{"soft-pinning", &pinningRegProvider{Fabric: f}, f}, allocProvider{"shm", sp, nil})
	const size = directPinMinWrite
	for _, pv := range provs {
		t.Run(pv.name, func(t *testing.T) {
			w, r := connPair(t, pv.p, Options{NoPlacement: true}) // on a device, it must hold a GID for 127.0.0.1
			done := drainReads(r, size)
			buf := make([]byte, size)
			for range 8 { // the ring grows, the buffer is registered: the steady state
				_, err := w.Write(buf)
				require.NoError(t, err)
			}
			// One-off work in the window (a resize the peer's ring had still to make,
			// a keepalive tick) is averaged over the runs, as allocguard's are; an
			// allocation per Write is not. The ring sizes say whether a resize came.
			ringBefore := ringSizes(w, r)
			allocs := testing.AllocsPerRun(100, func() {
				if _, err := w.Write(buf); err != nil {
					panic(err)
				}
			})
			ringAfter := ringSizes(w, r)
			require.Equal(t, 1, directRegistered(w), "registered buffers after %d-byte Writes", size)
			require.NoError(t, w.Close())
			require.ErrorIs(t, <-done, io.EOF)
			require.NoError(t, r.Close())
			require.Zero(t, allocs, "allocations per direct %d-byte Write and its Reads (rings %v before, %v after)",
				size, ringBefore, ringAfter)
			if pv.f != nil {
				requireReleased(t, pv.f)
			}
			closeIdleAll(t) // with the shells pooled on the device (pool.go)
			total, pinned := RegisteredMemory()
			require.Zero(t, total, "registered bytes after Close")
			require.Zero(t, pinned, "pinned bytes after Close")
		})
	}
}

// ringSizes is the current receive-ring size of each Conn.
func ringSizes(cs ...*Conn) []int {
	sizes := make([]int, len(cs))
	for i, c := range cs {
		c.mu.Lock()
		sizes[i] = c.fc.RingSize()
		c.mu.Unlock()
	}
	return sizes
}
