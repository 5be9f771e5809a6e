//go:build !race

package rdma

import (
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestWriteDirectAllocs checks that steady-state direct Writes, and the Reads that take
// them, allocate nothing once the buffer is registered (AllocsPerRun's warm-up call
// registers it), and that the Writes were direct: one registration, reused.
func TestWriteDirectAllocs(t *testing.T) {
	for _, size := range []int{directMinWrite, 64 << 10, 1 << 20} {
		t.Run(fmt.Sprintf("%dB", size), func(t *testing.T) {
			f := soft.New(soft.Options{})
			w, r := connPair(t, f, Options{})
			done := drainReads(r, size)
			buf := make([]byte, size)
			allocs := testing.AllocsPerRun(100, func() {
				if _, err := w.Write(buf); err != nil {
					panic(err)
				}
			})
			require.Equal(t, 1, directRegistered(w), "registered buffers after %d-byte Writes", size)
			require.NoError(t, w.Close())
			require.ErrorIs(t, <-done, io.EOF)
			require.NoError(t, r.Close())
			require.Zero(t, allocs, "allocations per direct %d-byte Write and its Reads", size)
			requireReleased(t, f)
		})
	}
}
