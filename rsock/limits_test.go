package rsock

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// held returns what the listener holds in total and for the remote address of key, and
// how many remote addresses hold anything.
func (b *listenerBudget) held(key netip.Prefix) (total, remote usage, remotes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, b.remote[key], len(b.remote)
}

func tcpAddr(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

func TestRemoteKey(t *testing.T) {
	tests := []struct {
		addr net.Addr
		want string
	}{
		{tcpAddr("10.0.0.7:4000"), "10.0.0.7/32"},
		{tcpAddr("[::ffff:10.0.0.7]:4000"), "10.0.0.7/32"},
		{tcpAddr("[2001:db8:1:2:aaaa::1]:4000"), "2001:db8:1:2::/64"},
		{tcpAddr("[2001:db8:1:2:bbbb::9]:4000"), "2001:db8:1:2::/64"},
		{&net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::/64"},
	}
	for _, tt := range tests {
		got, ok := remoteKey(tt.addr)
		require.True(t, ok, "remoteKey(%v)", tt.addr)
		require.Equal(t, tt.want, got.String(), "remoteKey(%v)", tt.addr)
	}
	_, ok := remoteKey(&net.UnixAddr{Name: "/tmp/x", Net: "unix"})
	require.False(t, ok, "remoteKey of a Unix address")
}

// TestListenerBudget charges and refunds a listener's budget from several remote
// addresses: each charge past a limit is refused with the limit that refused it, and
// grants nothing.
func TestListenerBudget(t *testing.T) {
	type step struct {
		from    string // remote address
		qps     int
		bytes   int
		refund  bool
		refused string // the limit error's text, empty when granted
	}
	const a, b, a6, b6 = "10.0.0.1:1", "10.0.0.2:1", "[2001:db8::1]:1", "[2001:db8::2]:1"
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "connections per remote address",
			cfg:  Config{MaxRDMAConnsPerRemote: 2, MaxRDMAConnsPerListener: -1},
			steps: []step{
				{from: a, qps: 1}, {from: a, qps: 1},
				{from: a, qps: 1, refused: "limit of 2 RDMA connections for remote address 10.0.0.1 reached: 2 held, 1 more asked (Config.MaxRDMAConnsPerRemote)"},
				{from: b, qps: 1}, {from: b, qps: 1},
				{from: a, qps: 1, refund: true}, {from: a, qps: 1},
			},
		},
		{
			name: "an IPv6 /64 is one remote address",
			cfg:  Config{MaxRDMAConnsPerRemote: 1},
			steps: []step{
				{from: a6, qps: 1},
				{from: b6, qps: 1, refused: "limit of 1 RDMA connections for remote address 2001:db8::/64 reached: 1 held, 1 more asked (Config.MaxRDMAConnsPerRemote)"},
			},
		},
		{
			name: "connections per listener",
			cfg:  Config{MaxRDMAConnsPerRemote: -1, MaxRDMAConnsPerListener: 3},
			steps: []step{
				{from: a, qps: 1}, {from: b, qps: 1}, {from: a6, qps: 1},
				{from: b6, qps: 1, refused: "limit of 3 RDMA connections for the listener reached: 3 held, 1 more asked (Config.MaxRDMAConnsPerListener)"},
				{from: b, qps: 1, refund: true}, {from: b6, qps: 1},
			},
		},
		{
			name: "registered memory per remote address",
			cfg:  Config{MaxRegisteredMemoryPerRemote: 100},
			steps: []step{
				{from: a, bytes: 60}, {from: a, bytes: 40},
				{from: a, bytes: 1, refused: "limit of 100 bytes of registered memory for remote address 10.0.0.1 reached: 100 held, 1 more asked (Config.MaxRegisteredMemoryPerRemote)"},
				{from: a, qps: 1}, // a queue pair is not memory
				{from: b, bytes: 100},
			},
		},
		{
			name: "registered memory per listener",
			cfg:  Config{MaxRegisteredMemoryPerListener: 100},
			steps: []step{
				{from: a, bytes: 70},
				{from: b, bytes: 31, refused: "limit of 100 bytes of registered memory for the listener reached: 70 held, 31 more asked (Config.MaxRegisteredMemoryPerListener)"},
				{from: b, bytes: 30},
			},
		},
		{
			name: "the remote address's limit is named before the listener's",
			cfg:  Config{MaxRDMAConnsPerRemote: 1, MaxRDMAConnsPerListener: 1},
			steps: []step{
				{from: a, qps: 1},
				{from: a, qps: 1, refused: "limit of 1 RDMA connections for remote address 10.0.0.1 reached: 1 held, 1 more asked (Config.MaxRDMAConnsPerRemote)"},
				{from: b, qps: 1, refused: "limit of 1 RDMA connections for the listener reached: 1 held, 1 more asked (Config.MaxRDMAConnsPerListener)"},
			},
		},
		{
			name: "negative means no limit",
			cfg:  Config{MaxRDMAConnsPerRemote: -1, MaxRDMAConnsPerListener: -1, MaxRegisteredMemoryPerRemote: -1, MaxRegisteredMemoryPerListener: -1},
			steps: []step{
				{from: a, qps: 1 << 20, bytes: 1 << 40},
				{from: a, qps: 1 << 20, bytes: 1 << 40},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := tt.cfg.resolve()
			require.NoError(t, err)
			lb := newListenerBudget(cfg)
			var granted []step
			for i, s := range tt.steps {
				r := lb.forRemote(tcpAddr(s.from))
				if s.refund {
					r.Refund(s.qps, s.bytes)
					for j, g := range granted {
						if g.from == s.from && g.qps == s.qps && g.bytes == s.bytes {
							granted = append(granted[:j], granted[j+1:]...)
							break
						}
					}
					continue
				}
				before, _, _ := lb.held(netip.Prefix{})
				err := r.Charge(s.qps, s.bytes)
				if s.refused == "" {
					require.NoError(t, err, "step %d: charge(%d, %d) from %s", i, s.qps, s.bytes, s.from)
					granted = append(granted, s)
					continue
				}
				require.EqualError(t, err, s.refused, "step %d: charge(%d, %d) from %s", i, s.qps, s.bytes, s.from)
				require.ErrorIs(t, err, ErrResourcesExhausted)
				after, _, _ := lb.held(netip.Prefix{})
				require.Equal(t, before, after, "step %d: a refused charge granted something", i)
			}
			// Refunding what was granted leaves nothing held anywhere.
			for _, g := range granted {
				lb.forRemote(tcpAddr(g.from)).Refund(g.qps, g.bytes)
			}
			total, _, remotes := lb.held(netip.Prefix{})
			require.Equal(t, usage{}, total, "held after every refund")
			require.Zero(t, remotes, "remote addresses held after every refund")
		})
	}
}

// TestRDMAResourceLimits opens connections to a Listener past each of its limits on what
// clients hold: the connection past it falls back to TCP on both sides with a reason
// that matches ErrResourcesExhausted and names the limit (the client's through the
// server's decline), works, and RDMA is used again once an RDMA connection closes and
// gives its resources back. A refusal in the middle of a setup (the send buffer, after
// the ring was granted) gives back what was granted.
func TestRDMAResourceLimits(t *testing.T) {
	// A fixed ring (and its 64-byte mailbox) and send buffer: what a server endpoint
	// registers up front, and all it registers.
	const ring, sendBuf = 64 << 10, 16 << 10
	const ringMR = ring + 64
	const perConn = ringMR + sendBuf
	tests := []struct {
		name      string
		transport Fallback
		set       func(c *Config)
		limit     string // in the server's reason
	}{
		{"connections per remote address", FallbackTCP, func(c *Config) { c.MaxRDMAConnsPerRemote = 2 },
			"limit of 2 RDMA connections for remote address 127.0.0.1"},
		{"connections per remote address over QUIC", FallbackQUIC, func(c *Config) { c.MaxRDMAConnsPerRemote = 2 },
			"limit of 2 RDMA connections for remote address 127.0.0.1"},
		{"connections per listener", FallbackTCP, func(c *Config) { c.MaxRDMAConnsPerRemote, c.MaxRDMAConnsPerListener = -1, 2 },
			"limit of 2 RDMA connections for the listener"},
		{"memory per remote address, refused at the ring", FallbackTCP, func(c *Config) { c.MaxRegisteredMemoryPerRemote = 2*perConn + ring/2 },
			fmt.Sprintf("bytes of registered memory for remote address 127.0.0.1 reached: %d held, %d more asked", 2*perConn, ringMR)},
		{"memory per listener, refused at the send buffer", FallbackTCP, func(c *Config) { c.MaxRegisteredMemoryPerListener = 2*perConn + ringMR },
			fmt.Sprintf("bytes of registered memory for the listener reached: %d held, %d more asked", 2*perConn+ringMR, sendBuf)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, tt.transport, fab)
			scfg.RingSize, scfg.GrowRingTo, scfg.SendBufferSize = ring, -1, sendBuf
			tt.set(scfg)
			ln := listen(t, scfg)
			var conns []*Conn
			for i := range 2 {
				c, s := pipe(t, ln, ccfg)
				require.Equal(t, TransportRDMA, c.Transport(), "conn %d: %v", i, c.FallbackReason())
				conns = append(conns, c, s)
			}
			c, s := pipe(t, ln, ccfg)
			require.Equal(t, tt.transport.String(), c.Transport(), "past the limit")
			require.ErrorIs(t, s.FallbackReason(), ErrResourcesExhausted)
			require.Contains(t, s.FallbackReason().Error(), tt.limit)
			require.ErrorIs(t, c.FallbackReason(), ErrResourcesExhausted)
			require.ErrorIs(t, c.FallbackReason(), ErrPeerDeclined)
			requireEcho(t, c, s)
			c.Close()
			s.Close()

			key, _ := remoteKey(conns[1].RemoteAddr())
			total, remote, _ := ln.budget.held(key)
			require.Equal(t, usage{qps: 2, bytes: 2 * perConn}, total, "held by two connections")
			require.Equal(t, total, remote, "held by two connections from %v", key)

			conns[0].Close()
			conns[1].Close()
			c, s = pipe(t, ln, ccfg)
			require.Equal(t, TransportRDMA, c.Transport(), "after a close: %v", c.FallbackReason())
			requireEcho(t, c, s)
			for _, c := range append(conns, c, s) {
				c.Close()
			}
			require.NoError(t, ln.Close())
			total, _, remotes := ln.budget.held(key)
			require.Equal(t, usage{}, total, "held once every connection closed")
			require.Zero(t, remotes)
			requireReleased(t, fab)
		})
	}
}

// TestRDMALimitsOnlyOnListeners: a Dialer's Config may carry tiny limits; they bound
// nothing on the dialing side.
func TestRDMALimitsOnlyOnListeners(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	ccfg.MaxRDMAConnsPerRemote, ccfg.MaxRDMAConnsPerListener = 1, 1
	ccfg.MaxRegisteredMemoryPerRemote, ccfg.MaxRegisteredMemoryPerListener = 1, 1
	ln := listen(t, scfg)
	var conns []*Conn
	for i := range 3 {
		c, s := pipe(t, ln, ccfg)
		require.Equal(t, TransportRDMA, c.Transport(), "conn %d: %v", i, c.FallbackReason())
		conns = append(conns, c, s)
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	require.NoError(t, ln.Close())
	requireReleased(t, fab)
}

// TestNilListenerBudget: a Listener built without Listen has no budget, and its
// connections are charged to none (not to a nil one, which would fail at the first
// charge).
func TestNilListenerBudget(t *testing.T) {
	var lb *listenerBudget
	require.Nil(t, lb.forRemote(tcpAddr("10.0.0.1:1")))
}

// TestLeavesHalf: whether a charge leaves half of each registered-memory limit that
// counts the connection free, its remote address's and the listener's.
func TestLeavesHalf(t *testing.T) {
	tests := []struct {
		name                   string
		perRemote, perListener int64 // limits; 0: none
		heldRemote, heldOther  int   // bytes held by this remote address and by another
		ask                    int64
		want                   bool
	}{
		{"no limits", 0, 0, 1 << 30, 0, 1 << 30, true},
		{"within half of the remote's", 100, 0, 20, 0, 30, true},
		{"past half of the remote's", 100, 0, 20, 0, 31, false},
		{"past half of the listener's, through another remote", 0, 100, 20, 40, 11, false},
		{"within half of the listener's", 1000, 100, 20, 20, 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb := newListenerBudget(&Config{MaxRegisteredMemoryPerRemote: tt.perRemote, MaxRegisteredMemoryPerListener: tt.perListener})
			r := lb.forRemote(tcpAddr("10.0.0.1:1")).(*remoteBudget)
			require.NoError(t, r.Charge(0, tt.heldRemote))
			require.NoError(t, lb.forRemote(tcpAddr("10.0.0.2:1")).Charge(0, tt.heldOther))
			require.Equal(t, tt.want, r.leavesHalf(tt.ask))
		})
	}
}
