//go:build !race

package rdma

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// TestControlEndedAllocs: a Conn's first peek through a handle handed over allocates
// nothing; its callback comes from a pool (conn_ctrlpeek.go). Each run peeks from a
// Conn of its own, as each connection's Close does.
func TestControlEndedAllocs(t *testing.T) {
	ours, peer := tcpPair(t)
	defer ours.Close()
	defer peer.Close()
	raw, err := ours.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	const runs = 100
	conns := make([]Conn, runs+1) // AllocsPerRun's warm-up, then its runs
	next := 0
	allocs := testing.AllocsPerRun(runs, func() {
		c := &conns[next]
		next++
		c.ctrl = ours
		c.UseControlSocket(raw)
		if c.controlEnded() {
			panic("an open, silent channel found ended")
		}
	})
	require.Zero(t, allocs, "allocations per peek")
}
