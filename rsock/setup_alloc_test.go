//go:build !race

package rsock

import (
	"net"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// (Not built with -race: the race detector's instrumentation allocates.)

// maxSetupAllocs bounds the allocations of one RDMA connection's whole life on soft, as
// TestSetupAllocs counts them: both ends' dial, accept, handshake, path proof and close,
// the bootstrap TCP connection's own included, and soft's queue pairs and
// registrations (about 20). It measured 217 before devices stayed warm between
// connections and setup stopped allocating on its success path what only errors need,
// 156 after, 104 once the handshake's deadline context made no timer nobody waits on,
// deadlines no channel until set, soft's QPs fewer slices, close no heap defer and the
// server's proof answer no goroutine, 96 once the client took the server's proof by
// polling (no timer when it comes back at once) and the poller's and event
// listener's restarts made no context.WithCancel, 94 once Close polled for its FIN's
// completion before it started a timer (the handshake's polling of the bootstrap
// connection, bootspin.go, costs two allocations a side), 75 once what setup always
// makes together moved into structs it allocates anyway (flow control and the engine's
// Conn in the Endpoint, the dial's Config, the server's hello reader and context) and
// the channels and timers that most connections never wait on (the drain's, the
// proof's, soft's QP timers) were made only when first needed, 65 once each end took
// its protection domain, ring and staging buffer from its device's pool of the
// previous connections' (rdma's pool.go) instead of allocating and registering them,
// 59 once the engine's Conn made its readable and writable channels only when a Read or
// Write first parks and marked its close with a flag rather than a channel, 61 once a
// Close that follows its peer's peeked at the control socket (conn_ctrlpeek.go: the
// socket's handle and the peek's callback), and 57 once that peek took the handle the
// handshake's polling Reads had made (bootspin.go) and both took their callbacks from
// pools, 53 once the control reader kept the keepalive periods with its Read's
// deadline instead of a timer of each Conn's own, and 54 once the Listener prepared its
// next client's endpoint ahead (spare.go: the goroutine that prepares it). The bound
// leaves a little room for the background work (the control channel) that a run may or
// may not catch. Half of the bound, 28, is one end's share: what one dial may cost
// (#15's target is 30).
const maxSetupAllocs = 56

// TestSetupAllocs dials, accepts and closes RDMA connections one after the other on a
// warm soft device, and bounds their allocations. testing.AllocsPerRun counts every
// goroutine's, so the server's handshake, the pollers and the closing are included;
// each run waits for the connection's queue pairs to be gone, so that no run's
// teardown is counted in the next.
func TestSetupAllocs(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	ln := listen(t, scfg)
	addr := ln.Addr().String()
	cycle := func() {
		c, err := Dial("tcp", addr, ccfg)
		if err != nil {
			panic(err)
		}
		s, err := ln.AcceptRsock()
		if err != nil {
			panic(err)
		}
		if c.Transport() != TransportRDMA || s.Transport() != TransportRDMA {
			panic("not upgraded: " + c.Transport() + ", " + s.Transport())
		}
		c.Close()
		s.Close() // and starts preparing the listener's spare endpoint for the next cycle (spare.go)
		ln.spare.settle()
		for fab.Stats().QPs > ln.spare.qps() {
			runtime.Gosched()
		}
	}
	cycle() // the device warms up
	allocs := testing.AllocsPerRun(50, cycle)
	tcp := tcpSetupAllocs(t)
	t.Logf("%.0f allocations per connection set up and closed; %.0f of them rsock's own (a plain TCP connection's, dialed, accepted and closed, are %.0f)",
		allocs, allocs-tcp, tcp)
	require.LessOrEqual(t, allocs, float64(maxSetupAllocs), "allocations per connection set up and closed")

	require.NoError(t, ln.Close())
	requireReleased(t, fab)
}

// tcpSetupAllocs is the allocations of a loopback TCP connection dialed, accepted and
// closed with package net alone: the part of TestSetupAllocs' count that is the
// bootstrap connection's, which rsock shares with any TCP client and server.
func tcpSetupAllocs(t *testing.T) float64 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	addr := ln.Addr().String()
	return testing.AllocsPerRun(50, func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			panic(err)
		}
		s, err := ln.Accept()
		if err != nil {
			panic(err)
		}
		c.Close()
		s.Close()
	})
}
