package rdma

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rsockio/rsock/verbs"
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

// TestSHMEngineCQsDriven: an engine's CQ holds at most 16,384/73 = 224 QPs (8 receive
// WQEs, the least), and verbs/shm's Polls drive that many: with both ends of 112
// connections in one process on one CQ, its polls still drive every ring, so that no
// exchange waits for a doorbell (verbs/shm's maxDriven; when it was 64, from 33
// connections every one did, at a tenth of TCP's round trips).
func TestSHMEngineCQsDriven(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() {
		require.NoError(t, closeIdle(func(q verbs.Provider) bool { return q == p })) // warm.go
		require.NoError(t, p.Close())
	}()
	const pairs = 16384 / (DefaultSendWQEs + 8 + 1) / 2
	var conns []*Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range pairs {
		a, b := connPair(t, p, Options{RecvWQEs: 8})
		conns = append(conns, a, b)
	}
	require.Same(t, conns[0].poll, conns[len(conns)-1].poll, "all on one CQ")
	for i, c := range conns {
		require.NotNil(t, c.poll.driver, "conn %d: shm's CQ says whether its polls drive", i)
		require.False(t, c.poll.spinFutile(), "conn %d: polls drive nothing, with %d QPs on the CQ", i, len(conns))
	}
}
