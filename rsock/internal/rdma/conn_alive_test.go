package rdma

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// pipePairKA connects two Conns on soft0 whose control channel is a net.Pipe, a with
// keepalive period kaA and b with kaB, so that a synctest bubble sees every goroutine
// of theirs durably blocked when idle.
func pipePairKA(t *testing.T, f *soft.Fabric, kaA, kaB time.Duration) (*Conn, *Conn) {
	ca, cb := net.Pipe()
	ea, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	eb, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	type res struct {
		c   *Conn
		err error
	}
	bc := make(chan res, 1)
	go func() {
		b, err := eb.Connect(ea.Offer(), cb, kaB)
		bc <- res{b, err}
	}()
	a, err := ea.Connect(eb.Offer(), ca, kaA)
	require.NoError(t, err)
	r := <-bc
	require.NoError(t, r.err)
	startPair(t, a, r.c)
	return a, r.c
}

// retryBudget is how long a QP connected by connectQP retries a lost request before
// RETRY_EXC_ERR: RetryCount+1 tries of the local ACK timeout (4.096 µs × 2^14).
const retryBudget = 8 * (4096 * time.Nanosecond << 14)

// TestSilentPeerFromStart checks the bound on detecting a peer that falls silent, on
// the bubble's clock: from the very start of the connection, or after traffic, a
// connection whose path dies fails within a keepalive period and the QP's retry budget,
// and one whose peer's device stops answering altogether within maxSilentPeriods
// periods; a peer that answers is never cut off, even one without keepalives.
func TestSilentPeerFromStart(t *testing.T) {
	const period = time.Second // longer than the retry budget, as the default 15 s is
	tests := []struct {
		name      string
		kaB       time.Duration // the peer's keepalive period
		traffic   bool          // exchange bytes before the fault
		fault     func(f *soft.Fabric, a, b *Conn)
		want      []error       // a's error, one of; none: a stays up for 100 periods
		withinMax time.Duration // bound on a's failure, from the fault
	}{
		{
			name:  "path dies at the start",
			kaB:   period,
			fault: func(f *soft.Fabric, a, b *Conn) { require.NoError(t, f.BreakQP(b.ep.qp)) },
			want:  []error{ErrQPFailed}, withinMax: period + retryBudget,
		},
		{
			name:    "path dies after traffic",
			kaB:     period,
			traffic: true,
			fault:   func(f *soft.Fabric, a, b *Conn) { require.NoError(t, f.BreakQP(b.ep.qp)) },
			want:    []error{ErrQPFailed}, withinMax: period + retryBudget,
		},
		{
			name: "peer without keepalives, path dies at the start",
			kaB:  0,
			fault: func(f *soft.Fabric, a, b *Conn) {
				require.NoError(t, f.BreakQP(b.ep.qp))
			},
			want: []error{ErrQPFailed}, withinMax: period + retryBudget,
		},
		{
			name: "device stops answering at the start",
			kaB:  period,
			fault: func(f *soft.Fabric, a, b *Conn) {
				require.NoError(t, f.DelayLink("soft0", "soft0", 1000*time.Hour))
			},
			// b, just as deaf, may give up first and close the control channel. The proof
			// exchange just before Start is the peer's last sign of life.
			want: []error{ErrKeepaliveTimeout, ErrControlLost}, withinMax: (maxSilentPeriods + 1) * period,
		},
		{
			name:    "device stops answering after traffic",
			kaB:     period,
			traffic: true,
			fault: func(f *soft.Fabric, a, b *Conn) {
				require.NoError(t, f.DelayLink("soft0", "soft0", 1000*time.Hour))
			},
			want: []error{ErrKeepaliveTimeout, ErrControlLost}, withinMax: (maxSilentPeriods + 1) * period,
		},
		{
			name:  "idle peer without keepalives",
			kaB:   0,
			fault: func(f *soft.Fabric, a, b *Conn) {},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := soft.New(soft.Options{})
				a, b := pipePairKA(t, f, period, tt.kaB)
				if tt.traffic {
					time.Sleep(5 * period / 2) // a few keepalive periods of normal life
					_, err := a.Write([]byte("ping"))
					require.NoError(t, err)
					_, err = io.ReadFull(b, make([]byte, 4))
					require.NoError(t, err)
				}
				start := time.Now()
				tt.fault(f, a, b)
				if len(tt.want) == 0 {
					time.Sleep(100 * period)
					_, err := a.Write([]byte("x"))
					require.NoError(t, err, "a connection whose peer answers, idle for 100 periods")
					_, err = io.ReadFull(b, make([]byte, 1))
					require.NoError(t, err)
				} else {
					_, err := a.Read(make([]byte, 1))
					elapsed := time.Since(start)
					named := false
					for _, want := range tt.want {
						named = named || errors.Is(err, want)
					}
					require.True(t, named, "a's error %v, want one of %v", err, tt.want)
					if errors.Is(err, ErrControlLost) {
						// b gave up first: a learns it from the control channel, after
						// the grace for a FIN in flight.
						tt.withinMax += closeGrace
					}
					require.LessOrEqual(t, elapsed, tt.withinMax,
						"%s: a failed %v after the fault, bound %v", tt.name, elapsed, tt.withinMax)
				}
				a.Close()
				b.Close()
				requireReleased(t, f)
			})
		})
	}
}

// TestCheckSilence drives checkSilenceLocked by hand: periods without a completion
// count up, any completion resets the count, and the third silent period fails the
// Conn with ErrKeepaliveTimeout naming the time.
func TestCheckSilence(t *testing.T) {
	q := &fakeQP{qpn: 7}
	c := newFakeConn(t, q)
	c.kaPeriod = time.Second
	c.mu.Lock()
	defer c.mu.Unlock()
	steps := []struct {
		heard  bool
		failed bool
	}{
		{false, false}, {false, false}, {true, false}, // reset by a completion
		{false, false}, {false, false}, {false, true},
	}
	for i, s := range steps {
		if s.heard {
			c.heardLocked()
		}
		got := c.checkSilenceLocked()
		require.Equal(t, s.failed, got, "period %d: checkSilenceLocked() = %v, want %v", i+1, got, s.failed)
	}
	require.ErrorIs(t, c.err, ErrKeepaliveTimeout)
	require.Contains(t, c.err.Error(), "for 3s")
}

// TestProbesEndWithThePeer: once the peer has closed (its FIN arrived, its QP is
// destroyed), probing stops, so the end of the stream stays a clean io.EOF however
// long the connection stays open, and no silence is reported.
func TestProbesEndWithThePeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = time.Second
		f := soft.New(soft.Options{})
		a, b := pipePairKA(t, f, period, period)
		require.NoError(t, b.Close())
		_, err := a.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF)
		time.Sleep(10 * period)
		_, err = a.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "ten periods after the peer closed")
		require.NoError(t, connErrOf(a))
		require.NoError(t, a.Close())
		requireReleased(t, f)
	})
}

// countingSocket is a control channel on a TCP socket that counts the keepalive bytes
// written to it. It still exposes the socket (SyscallConn is promoted), as rsock's
// bootstrap connections do.
type countingSocket struct {
	*net.TCPConn
	keepalives atomic.Int32
}

func (s *countingSocket) Write(b []byte) (int, error) {
	s.keepalives.Add(int32(bytes.Count(b, ctrlKeepalive[:])))
	return s.TCPConn.Write(b)
}

// TestKeepaliveOnSocket: over a socket, where the control reader sends each period's
// keepalive itself (tickKeepalive), keepalives go out period after period, and the
// connection carries data meanwhile and after. Only a keeps alive, so neither end
// ever times out the other's silence, however slowly the machine runs the readers.
func TestKeepaliveOnSocket(t *testing.T) {
	f := soft.New(soft.Options{})
	ta, tb := tcpPair(t)
	ca := &countingSocket{TCPConn: ta.(*net.TCPConn)}
	ea, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	eb, err := Prepare(f, loopback, Options{})
	require.NoError(t, err)
	const period = 5 * time.Millisecond
	a, err := ea.Connect(eb.Offer(), ca, period)
	require.NoError(t, err)
	b, err := eb.Connect(ea.Offer(), tb, 0)
	require.NoError(t, err)
	startPair(t, a, b)

	for i := range 3 {
		before := ca.keepalives.Load()
		require.Eventually(t, func() bool { return ca.keepalives.Load() > before }, 10*time.Second, time.Millisecond,
			"keepalive %d never went out", i+1)
		_, err := a.Write([]byte{byte(i)})
		require.NoError(t, err)
		got := make([]byte, 1)
		_, err = io.ReadFull(b, got)
		require.NoError(t, err)
		require.Equal(t, byte(i), got[0])
	}
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}
