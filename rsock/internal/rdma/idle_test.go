package rdma

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// fixedOptions are the defaults from before rings grew: a fixed 128 KiB ring and 64 KiB
// of staging.
var fixedOptions = Options{RingSize: 128 << 10, GrowRingTo: -1, SendBufferSize: 64 << 10}

// footprint is the process's live memory: the heap after a collection (on soft it
// includes the registered memory, which soft allocates from the heap) and the
// goroutine stacks, with what the engine has registered.
type footprint struct {
	heap, stacks, registered int64
}

func measure() footprint {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	reg, _ := RegisteredMemory()
	return footprint{heap: int64(m.HeapAlloc), stacks: int64(m.StackInuse), registered: reg}
}

// TestIdleFootprint opens 1,000 idle connections (both ends in this process, on soft)
// at the defaults (rings that grow), and measures what each end holds, all included: heap with the
// registered memory, its share of the CQs, and goroutine stacks. An idle end costs at
// most 64 KiB, at most 32 KiB of it registered (pinned, on a real device). After Close,
// the process is back where it was with the CQs open (the device keeps them while it is
// open).
func TestIdleFootprint(t *testing.T) {
	// Per end, 1,000 connections measure what 5,000 did to within 2% (fixed costs
	// spread thinly enough), in a fifth of the time.
	n := 1000
	switch {
	case testing.Short():
		n = 500
	case raceEnabled:
		n = 200
	}
	closeIdleAll(t) // registered memory is counted over every device: no other's pool
	f := soft.New(soft.Options{})
	// A first connection keeps the device open. The device keeps the CQs (and their
	// pollers) it grew for the connections, each shared by up to CQSize/(SendWQEs+
	// RecvWQEs) connection ends, until it closes: a first round opens them.
	a0, b0 := connPair(t, f, Options{})
	before := measure()
	openAll := func() []*Conn {
		conns := make([]*Conn, 0, 2*n)
		for range n {
			a, b := connPair(t, f, Options{})
			conns = append(conns, a, b)
		}
		return conns
	}
	closeAll := func(conns []*Conn) {
		for _, c := range conns {
			require.NoError(t, c.Close())
		}
	}
	closeAll(openAll())
	base := measure()
	t.Logf("CQs kept by the device for %d connection ends: %.1f KiB per end", 2*n, float64(base.heap-before.heap)/float64(2*n)/1024)
	conns := openAll()
	open := measure()
	ends := float64(2 * n)
	perEnd := func(v int64) float64 { return float64(v) / ends }
	// Counted from before the CQs: their share is part of what a connection costs.
	heap, stacks, reg := perEnd(open.heap-before.heap), perEnd(open.stacks-before.stacks), perEnd(open.registered-before.registered)
	t.Logf("%d connections, per end: %.1f KiB in all (heap %.1f KiB incl. %.1f KiB registered and the CQs' share, stacks %.1f KiB)",
		n, (heap+stacks)/1024, heap/1024, reg/1024, stacks/1024)
	require.LessOrEqual(t, heap+stacks, float64(64<<10), "bytes per idle connection end, all included")
	require.LessOrEqual(t, reg, float64(32<<10), "registered bytes per idle connection end")

	closeAll(conns)
	conns = nil
	closed := measure()
	t.Logf("after Close: heap %+d B, stacks %+d B, registered %+d B against the start", closed.heap-base.heap, closed.stacks-base.stacks, closed.registered-base.registered)
	require.Equal(t, base.registered, closed.registered, "registered memory back to the start")
	// Back to the start, up to what a collection leaves behind: under 1% of one end's
	// figure per connection.
	require.Less(t, perEnd(closed.heap-base.heap), (heap+stacks)/100, "heap per end left after Close")
	// Goroutines a Close ends (a control reader it wakes) exit after it returns, and
	// their stacks go back at a later collection: wait for that, bounded.
	require.Eventually(t, func() bool {
		closed = measure()
		return perEnd(closed.stacks-base.stacks) < (heap+stacks)/100
	}, 30*time.Second, 10*time.Millisecond, "stacks per end left after Close: %+d B in all", closed.stacks-base.stacks)
	require.NoError(t, a0.Close())
	require.NoError(t, b0.Close())
	requireReleased(t, f)
}
