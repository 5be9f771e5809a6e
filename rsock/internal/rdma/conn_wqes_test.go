package rdma

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
)

// reservedOn is how many CQ entries c's poller has reserved, for every connection on it.
func reservedOn(c *Conn) int {
	c.poll.resMu.Lock()
	defer c.poll.resMu.Unlock()
	return c.poll.reserved
}

// TestRecvWQEsGrow: a one-way stream of small writes doubles the reader's receive queue
// up to its bound, and the CQ entries its connection reserves grow with it, while the
// writer's queue, which receives only credit, stays as it started; every byte arrives.
// Requests and answers return credit both ways as they go and grow neither queue; nor
// does a stream toward a queue whose size the options fix. It runs on soft; the one-way
// stream runs over shm too and, where this build has one and the machine a device
// (built with -tags rdma, in the Soft-RoCE VM), on the default provider.
func TestRecvWQEsGrow(t *testing.T) {
	tests := []struct {
		name   string
		opts   Options
		oneWay bool
		want   int
	}{
		{"one-way stream of small writes", Options{}, true, DefaultGrowRecvWQEsTo},
		{"requests and answers", Options{}, false, DefaultRecvWQEs},
		{"RecvWQEs set: fixed", Options{RecvWQEs: DefaultRecvWQEs}, true, DefaultRecvWQEs},
		{"GrowRecvWQEsTo negative: fixed", Options{GrowRecvWQEsTo: -1}, true, DefaultRecvWQEs},
		{"GrowRecvWQEsTo 256: two doublings", Options{GrowRecvWQEsTo: 256}, true, 256},
		{"GrowRecvWQEsTo 100: the doubling stops there", Options{GrowRecvWQEsTo: 100}, true, 100},
	}
	run := func(t *testing.T, p verbs.Provider, opts Options, oneWay bool, want int) {
		a, b := connPair(t, p, opts)
		base := reservedOn(b)
		if oneWay {
			sendAll(t, a, b, payload(2<<20, 5), 2<<10, 5)
		} else {
			buf := make([]byte, 512)
			for range 1000 {
				for _, pair := range [][2]*Conn{{a, b}, {b, a}} {
					_, err := pair[0].Write(buf)
					require.NoError(t, err)
					_, err = io.ReadFull(pair[1], buf)
					require.NoError(t, err)
				}
			}
		}
		require.Equal(t, want, b.Stats().RecvWQEs, "the reader's receive WQEs")
		require.Equal(t, DefaultRecvWQEs, a.Stats().RecvWQEs, "the writer's receive WQEs")
		require.Equal(t, base+want-DefaultRecvWQEs, reservedOn(b), "CQ entries reserved")
		require.Equal(t, DefaultSendWQEs+want+1, b.ep.entries)
		pingPong(t, a, b) // the stream goes on over the grown queue
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
	}
	for _, tt := range tests {
		t.Run("soft/"+tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			run(t, f, tt.opts, tt.oneWay, tt.want)
			requireReleased(t, f)
		})
	}
	t.Run("shm/"+tests[0].name, func(t *testing.T) {
		p, err := shm.New(shm.Options{})
		require.NoError(t, err)
		defer p.Close()
		run(t, p, tests[0].opts, true, tests[0].want)
	})
	p, err := auto.Default()
	if err != nil {
		t.Logf("no default provider here, soft only: %v", err)
		return
	}
	t.Run("default-"+p.Name()+"/"+tests[0].name, func(t *testing.T) {
		run(t, p, tests[0].opts, true, tests[0].want)
	})
}

// TestRecvWQEsGrowthStopsAtFullCQ: a CQ with no room for more WQEs' completions stops
// the growth, and the stream goes on over the queue it has.
func TestRecvWQEsGrowthStopsAtFullCQ(t *testing.T) {
	f := soft.New(soft.Options{})
	perConn := DefaultSendWQEs + DefaultRecvWQEs + 1
	a, b := connPair(t, f, Options{CQSize: 2*perConn + DefaultRecvWQEs - 1}) // both ends share the CQ
	sendAll(t, a, b, payload(2<<20, 6), 2<<10, 6)
	require.Equal(t, DefaultRecvWQEs, b.Stats().RecvWQEs)
	require.Equal(t, 2*perConn, reservedOn(b))
	b.mu.Lock()
	require.Zero(t, b.wqeGrowTo, "growth stopped")
	b.mu.Unlock()
	pingPong(t, a, b)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestRecvWQEsGrowOnFake: the arrivals of a one-way stream of small messages each make
// an update due by WQE count (one per 32 messages); at the fourth, the engine posts 64
// more receive WQEs, numbered after the first 64, and the update it sends then returns
// their credit with the 32 the messages made due.
func TestRecvWQEsGrowOnFake(t *testing.T) {
	c, q := resizingConn(t)
	entries := c.ep.entries
	for i := range 4 * DefaultRecvWQEs / 2 {
		copy(c.ring[4*i:], "data")
		arriveImm(t, c, uint64(i%DefaultRecvWQEs), flowctl.Imm{Kind: flowctl.KindData}, 4)
	}
	require.NoError(t, connErr(c))
	require.Equal(t, 2*DefaultRecvWQEs, c.Stats().RecvWQEs)
	require.Equal(t, entries+DefaultRecvWQEs, c.ep.entries)

	recvs := q.reposted()
	added := recvs[len(recvs)-DefaultRecvWQEs:]
	for i, wr := range added {
		require.Equal(t, recvWRFlag|c.gen|uint64(DefaultRecvWQEs+i), wr.ID, "added WQE %d", i)
		require.Empty(t, wr.SGL)
	}
	sends := q.posted()
	require.Len(t, sends, 4, "one credit update per 32 messages")
	var credits []uint32
	for _, wr := range sends {
		m, err := flowctl.DecodeImm(wr.Imm, 0)
		require.NoError(t, err)
		require.Equal(t, flowctl.KindCredit, m.Kind)
		credits = append(credits, m.WQECredits)
	}
	require.Equal(t, []uint32{32, 32, 32, 32 + DefaultRecvWQEs}, credits)
}

// TestRecvWQEsDefaults: the receive queue grows only from the default count, and a QP
// has room for what it may grow to, fitted below the device's max_qp_wr.
func TestRecvWQEsDefaults(t *testing.T) {
	tests := []struct {
		name               string
		opts               Options
		maxQPWR            int
		wantWQEs, wantGrow int
		wantCap            int
	}{
		{"defaults", Options{}, 0, 64, 128, 128},
		{"RecvWQEs set", Options{RecvWQEs: 32}, 0, 32, 32, 32},
		{"both set", Options{RecvWQEs: 32, GrowRecvWQEsTo: 512}, 0, 32, 512, 512},
		{"GrowRecvWQEsTo below RecvWQEs", Options{RecvWQEs: 32, GrowRecvWQEsTo: 16}, 0, 32, 32, 32},
		{"negative GrowRecvWQEsTo", Options{GrowRecvWQEsTo: -1}, 0, 64, 64, 64},
		{"max_qp_wr fits the growth", Options{}, 100, 64, 128, 99},
		{"max_qp_wr below RecvWQEs leaves it to checkCaps", Options{}, 50, 64, 128, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.opts.withDefaults()
			require.NoError(t, o.validate())
			require.Equal(t, tt.wantWQEs, o.RecvWQEs)
			require.Equal(t, tt.wantGrow, o.GrowRecvWQEsTo)
			require.Equal(t, tt.wantCap, recvCap(verbs.DeviceAttr{MaxQPWR: tt.maxQPWR}, o))
		})
	}
	require.Error(t, Options{GrowRecvWQEsTo: flowctl.MaxRecvWQEs + 1}.withDefaults().validate())

	// The offer names the growth; the QP has room for it.
	ep, err := Prepare(soft.New(soft.Options{}), loopback, Options{})
	require.NoError(t, err)
	defer ep.Abort()
	require.EqualValues(t, DefaultGrowRecvWQEsTo, ep.Offer().GrowRecvWQEsTo)
	require.Equal(t, DefaultGrowRecvWQEsTo, ep.recvCap)
}

// TestPeerGrowsOnFake: WQE credit from the peer beyond the messages we sent is WQEs it
// added, taken up to the growth its offer named; one credit more is a protocol error
// that fails the connection.
func TestPeerGrowsOnFake(t *testing.T) {
	for _, tt := range []struct {
		name    string
		surplus uint32
		wantErr bool
	}{
		{"the growth the offer named", DefaultGrowRecvWQEsTo - DefaultRecvWQEs, false},
		{"one WQE more", DefaultGrowRecvWQEsTo - DefaultRecvWQEs + 1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := resizingConn(t)
			arriveImm(t, c, 0, flowctl.Imm{Kind: flowctl.KindCredit, WQECredits: tt.surplus}, 0)
			err := connErr(c)
			if tt.wantErr {
				require.ErrorIs(t, err, ErrProtocol)
				require.ErrorIs(t, err, flowctl.ErrCreditOverflow)
				return
			}
			require.NoError(t, err)
		})
	}
}
