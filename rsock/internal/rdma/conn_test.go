package rdma

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(closingIdleDevices{m}) }

// closingIdleDevices runs the tests, then closes the devices kept open after their last
// connection (on rdma-core, each holds a goroutine) before goleak looks.
type closingIdleDevices struct{ m *testing.M }

func (c closingIdleDevices) Run() int {
	code := c.m.Run()
	if err := CloseIdle(nil); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	return code
}

var loopback = netip.MustParseAddr("127.0.0.1")

// tcpPair returns the two ends of a loopback TCP connection, standing in for the
// bootstrap connection.
func tcpPair(t testing.TB) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	r := <-ch
	require.NoError(t, r.err)
	return a, r.c
}

// connPair connects two Conns over provider p, both on loopback, with opts on both
// sides.
func connPair(t testing.TB, p verbs.Provider, opts Options) (*Conn, *Conn) {
	return connPairIPs(t, p, loopback.String(), loopback.String(), opts)
}

// drainReads reads r in size-byte pieces until a Read fails, in a goroutine of its
// own, and sends that error: the far end of a test that times or counts Writes.
func drainReads(r net.Conn, size int) <-chan error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(r, buf); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

func TestNetConn(t *testing.T) {
	f := soft.New(soft.Options{})
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b := connPair(t, f, Options{RingSize: 16 << 10, SendBufferSize: 8 << 10})
		return a, b, func() { a.Close(); b.Close() }, nil
	})
	// nettest leaves a copying goroutine of its own in Read when some cases stop their
	// pipe: that Read, not Close, releases its Conn's endpoint (teardown), as it returns
	// just after. Wait for it, bounded, before checking that everything went back.
	require.Eventually(t, func() bool { return f.Stats().QPs == 0 }, 10*time.Second, time.Millisecond,
		"a QP still held after the last case: %+v", f.Stats())
	requireReleased(t, f)
}

// requireReleased checks that every soft resource was given back.
func requireReleased(t *testing.T, f *soft.Fabric) {
	t.Helper()
	closeIdleOf(t, f) // warm.go keeps a device open after its last connection
	s := f.Stats()
	require.Zero(t, s.QPs, "QPs left: %+v", s)
	require.Zero(t, s.MRs, "MRs left: %+v", s)
	require.Zero(t, s.CQs, "CQs left: %+v", s)
	require.Zero(t, s.PDs, "PDs left: %+v", s)
	require.Zero(t, s.Contexts, "contexts left: %+v", s)
}

// TestStreamBothWays moves random-sized writes both ways at once through 4 KiB rings, so
// that wrap-around and credit exhaustion happen constantly, and checks every byte.
// Write sizes are log-uniform up to 4 MiB: writes within one ring and writes of many
// rings both come often.
func TestStreamBothWays(t *testing.T) {
	// 64 MiB each way wraps each ring 16384 times in several hundred writes of every size
	// class; a gigabyte (as this test once moved) only repeats that, for a third of
	// the package's run time.
	total := int64(64 << 20) // each way
	if testing.Short() {
		total = 8 << 20
	}
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{RingSize: 4 << 10, SendBufferSize: 4 << 10, RecvWQEs: 16, SendWQEs: 16})
	var wg sync.WaitGroup
	stream := func(w, r *Conn, seed uint64) {
		defer wg.Done()
		sent, got := sha256.New(), sha256.New()
		done := make(chan int64)
		go func() {
			n, err := io.Copy(got, r)
			require.NoError(t, err)
			done <- n
		}()
		rng := rand.New(rand.NewPCG(seed, seed))
		buf := make([]byte, 4<<20)
		var n int64
		for n < total {
			size := min(int64(1+rng.IntN(1<<rng.IntN(23))), total-n) // 1 B to 4 MiB
			p := buf[:size]
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			sent.Write(p)
			m, err := w.Write(p)
			require.NoError(t, err)
			require.Equal(t, len(p), m)
			n += size
		}
		require.NoError(t, w.CloseWrite())
		require.Equal(t, total, <-done)
		require.True(t, bytes.Equal(sent.Sum(nil), got.Sum(nil)), "hash mismatch")
	}
	wg.Add(2)
	go stream(a, b, 1)
	go stream(b, a, 2)
	wg.Wait()
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.Zero(t, f.Stats().RNRNAKs, "RNR NAKs")
	requireReleased(t, f)
}

func TestPeerCloseGivesEOF(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	_, err := a.Write([]byte("hello"))
	require.NoError(t, err)
	require.NoError(t, a.Close())
	got, err := io.ReadAll(b)
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestCloseWhilePeerWrites closes a Conn whose peer keeps writing into it, with data
// unread in its ring: Close returns, the peer's writer fails instead of blocking on
// credits that will never come, and both ends release everything.
func TestCloseWhilePeerWrites(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	wrote := make(chan struct{})
	writeErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 1024)
		for i := 0; ; i++ {
			if _, err := b.Write(buf); err != nil {
				writeErr <- err
				return
			}
			if i == 0 {
				close(wrote)
			}
		}
	}()
	<-wrote // the witness: data is in flight, and the writer is still going
	require.NoError(t, a.Close())
	require.Error(t, <-writeErr, "the writer to a closed peer")
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

func TestQPErrorFailsConn(t *testing.T) {
	f := soft.New(soft.Options{TimeScale: 0.001})
	a, b := connPair(t, f, Options{})
	require.NoError(t, f.FailQP(a.ep.qp))
	buf := make([]byte, 8)
	_, err := a.Read(buf)
	require.True(t, errors.Is(err, ErrQPFailed), "Read after QP failure: %v", err)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestKeepalive: with keepalives on at both ends an idle connection stays up, and a
// peer that goes silent (its control channel stalls, here by making its keepalive
// periods send nothing) is detected with ErrKeepaliveTimeout. It runs in a synctest
// bubble, the control channel on net.Pipe (real sockets do not block durably): the
// idle spell and the keepalive periods are on the bubble's clock, so "stays up" is
// decided, not sampled.
func TestKeepalive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := soft.New(soft.Options{})
		ca, cb := net.Pipe()
		ea, err := Prepare(f, loopback, Options{})
		require.NoError(t, err)
		eb, err := Prepare(f, loopback, Options{})
		require.NoError(t, err)
		const period = 20 * time.Millisecond
		type res struct {
			c   *Conn
			err error
		}
		// net.Pipe is unbuffered: both ends exchange their handshake at once.
		bc := make(chan res, 1)
		go func() {
			b, err := eb.Connect(ea.Offer(), cb, period)
			bc <- res{b, err}
		}()
		a, err := ea.Connect(eb.Offer(), ca, period)
		require.NoError(t, err)
		r := <-bc
		require.NoError(t, r.err)
		b := r.c
		startPair(t, a, b)

		time.Sleep(100 * period) // idle on the bubble's clock: a hundred keepalive periods
		_, err = a.Write([]byte("x"))
		require.NoError(t, err, "connection idle for 100 periods")
		buf := make([]byte, 1)
		_, err = io.ReadFull(b, buf)
		require.NoError(t, err)

		b.mu.Lock()
		b.closing = true // b falls silent: its keepalive periods send nothing
		b.mu.Unlock()
		_, err = a.Read(buf)
		require.ErrorIs(t, err, ErrKeepaliveTimeout)
		b.mu.Lock()
		b.closing = false
		b.mu.Unlock()
		a.Close()
		b.Close()
		requireReleased(t, f)
	})
}

// TestDeadlinesOnFake moves the deadline of a Read with nothing to read, and of a Write
// with the send queue full, on a fake Conn in a synctest bubble: the call returns
// os.ErrDeadlineExceeded when the deadline in force passes, not at one moved away
// before it passed, and never after the deadline is cleared; a deadline already past
// fails the call at once; clearing a deadline that passed lets the next call wait.
func TestDeadlinesOnFake(t *testing.T) {
	type set struct {
		at, to time.Duration // at this moment, set the deadline to start+to; to 0 clears it
	}
	tests := []struct {
		name   string
		sets   []set
		wantAt time.Duration // when the call returns; -1: never
	}{
		{name: "in a second", sets: []set{{0, time.Second}}, wantAt: time.Second},
		{name: "moved later", sets: []set{{0, time.Second}, {time.Second / 2, 3 * time.Second}}, wantAt: 3 * time.Second},
		{name: "moved earlier", sets: []set{{0, 3 * time.Second}, {time.Second, 2 * time.Second}}, wantAt: 2 * time.Second},
		{name: "moved into the past", sets: []set{{0, 3 * time.Second}, {time.Second, time.Second / 2}}, wantAt: time.Second},
		{name: "cleared", sets: []set{{0, time.Second}, {time.Second / 2, 0}}, wantAt: -1},
		{name: "already past", sets: []set{{0, -time.Second}}, wantAt: 0},
	}
	calls := []struct {
		name    string
		setDL   func(c *Conn, t time.Time) error
		prepare func(t *testing.T, c *Conn)
		call    func(c *Conn) error
		unblock func(t *testing.T, c *Conn, q *fakeQP)
	}{
		{
			name:  "Read",
			setDL: (*Conn).SetReadDeadline,
			call: func(c *Conn) error {
				_, err := c.Read(make([]byte, 8))
				return err
			},
			unblock: func(t *testing.T, c *Conn, q *fakeQP) { arrive(t, c, 0, flowctl.KindData, 0, "x") },
		},
		{
			name:  "Write",
			setDL: (*Conn).SetWriteDeadline,
			prepare: func(t *testing.T, c *Conn) {
				for range fakeSQDepth - 1 { // a data post may take two WRs: depth-1 fill the queue
					_, err := c.Write([]byte("x"))
					require.NoError(t, err)
				}
			},
			call: func(c *Conn) error {
				_, err := c.Write([]byte("y"))
				return err
			},
			unblock: func(t *testing.T, c *Conn, q *fakeQP) {
				wrs := q.posted()
				var last uint64
				for _, wr := range wrs {
					if wr.Flags&verbs.SendSignaled != 0 {
						last = wr.ID
					}
				}
				c.onCompletion(sendDone(last))
			},
		},
	}
	for _, call := range calls {
		for _, tt := range tests {
			t.Run(call.name+"/"+tt.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					q := &fakeQP{}
					c := newFakeConn(t, q)
					if call.prepare != nil {
						call.prepare(t, c)
					}
					start := time.Now()
					at := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) }
					require.NoError(t, call.setDL(c, start.Add(tt.sets[0].to)))
					done := make(chan error, 1)
					go func() { done <- call.call(c) }()
					returned := func() bool {
						synctest.Wait()
						return len(done) > 0
					}
					for _, s := range tt.sets[1:] {
						at(s.at)
						require.False(t, returned(), "returned before the deadline was set at %v", s.at)
						dl := time.Time{}
						if s.to != 0 {
							dl = start.Add(s.to)
						}
						require.NoError(t, call.setDL(c, dl))
					}
					if tt.wantAt < 0 {
						at(time.Hour)
						require.False(t, returned(), "returned with no deadline")
						call.unblock(t, c, q)
						require.NoError(t, <-done)
						return
					}
					if time.Since(start) < tt.wantAt {
						at(tt.wantAt - time.Nanosecond)
						require.False(t, returned(), "returned before %v", tt.wantAt)
						at(tt.wantAt)
					}
					require.True(t, returned(), "still waiting at %v", tt.wantAt)
					require.ErrorIs(t, <-done, os.ErrDeadlineExceeded)

					// Cleared after it passed: the next call waits again.
					require.NoError(t, call.setDL(c, time.Time{}))
					go func() { done <- call.call(c) }()
					at(time.Hour)
					require.False(t, returned(), "returned after the passed deadline was cleared")
					call.unblock(t, c, q)
					require.NoError(t, <-done)
				})
			})
		}
	}
}

// TestDeadlineSetDuringWait: a Read or Write blocked on a Conn whose deadlines were
// never set waits on no deadline channel (none is made until a deadline is set); setting
// the deadline then wakes it, and it returns os.ErrDeadlineExceeded.
func TestDeadlineSetDuringWait(t *testing.T) {
	tests := []struct {
		name string
		wait func(c *Conn) error // blocks: nothing arrives, nothing is acknowledged
		set  func(c *Conn, t time.Time) error
	}{
		{name: "Read, SetReadDeadline",
			wait: func(c *Conn) error { _, err := c.Read(make([]byte, 1)); return err },
			set:  (*Conn).SetReadDeadline},
		{name: "Read, SetDeadline",
			wait: func(c *Conn) error { _, err := c.Read(make([]byte, 1)); return err },
			set:  (*Conn).SetDeadline},
		{name: "Write, SetWriteDeadline",
			wait: func(c *Conn) error { _, err := c.Write(make([]byte, 4*fakeRing)); return err },
			set:  (*Conn).SetWriteDeadline},
		{name: "Write, SetDeadline",
			wait: func(c *Conn) error { _, err := c.Write(make([]byte, 4*fakeRing)); return err },
			set:  (*Conn).SetDeadline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newFakeConn(t, &fakeQP{})
				require.Nil(t, c.rdl.wait(), "read deadline channel before any deadline")
				require.Nil(t, c.wdl.wait(), "write deadline channel before any deadline")
				errc := make(chan error, 1)
				go func() { errc <- tt.wait(c) }()
				synctest.Wait() // blocked, on no deadline
				require.Empty(t, errc, "returned before its deadline was set")
				require.NoError(t, tt.set(c, time.Now()))
				synctest.Wait()
				select {
				case err := <-errc:
					require.ErrorIs(t, err, os.ErrDeadlineExceeded)
				default:
					t.Fatal("still blocked after its deadline was set to now")
				}
			})
		})
	}
}
