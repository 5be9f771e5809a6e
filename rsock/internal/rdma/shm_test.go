package rdma

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rsockio/rsock/verbs/shm"
)

// TestNetConnOverSHM runs the stream engine, unchanged, over the shared-memory provider:
// its two ends connect QPs through shm's sockets and regions as two processes would.
func TestNetConnOverSHM(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer p.Close()
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b := connPair(t, p, Options{RingSize: 16 << 10, SendBufferSize: 8 << 10})
		return a, b, func() { a.Close(); b.Close() }, nil
	})
}
