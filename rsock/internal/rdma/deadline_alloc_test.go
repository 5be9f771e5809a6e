//go:build !race

package rdma

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeadlineSetAllocs: moving a deadline that is already set, ahead or away and back,
// and parking on it, allocates nothing (net/http moves a connection's deadlines with
// every request).
func TestDeadlineSetAllocs(t *testing.T) {
	var d deadline
	d.set(time.Now().Add(time.Hour)) // the channel, once
	d.parkOn()                       // and the timer
	allocs := testing.AllocsPerRun(100, func() {
		d.set(time.Now().Add(time.Hour))
		d.parkOn()
		d.set(time.Time{})
		d.set(time.Now().Add(time.Minute))
		d.parkOn()
		d.passed()
	})
	require.Zero(t, allocs, "allocations per three moves of a deadline")
	d.set(time.Time{})
}
