package rdma

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestCloseBeforePeerReads: Close and CloseWrite return although the peer has not read
// a byte, and the peer later reads every byte Write accepted, then io.EOF; after a
// CloseWrite the other direction still works.
func TestCloseBeforePeerReads(t *testing.T) {
	for _, half := range []bool{false, true} {
		t.Run(map[bool]string{false: "Close", true: "CloseWrite"}[half], func(t *testing.T) {
			f := soft.New(soft.Options{})
			a, b := connPair(t, f, Options{})
			msg := streamBytes(7, 1<<20)
			_, err := a.Write(msg)
			require.NoError(t, err)
			if half {
				require.NoError(t, a.CloseWrite())
			} else {
				require.NoError(t, a.Close())
			}
			got, err := io.ReadAll(b)
			require.NoError(t, err)
			require.True(t, bytes.Equal(msg, got), "stream differs: %d bytes of %d", len(got), len(msg))
			if half {
				_, err := b.Write([]byte("reply"))
				require.NoError(t, err)
				reply := make([]byte, 5)
				_, err = io.ReadFull(a, reply)
				require.NoError(t, err)
				require.Equal(t, "reply", string(reply))
				require.NoError(t, a.Close())
			}
			require.NoError(t, b.Close())
			requireReleased(t, f)
		})
	}
}

// TestCloseLingerBound: when the peer's device does not acknowledge (here every request
// is held back for an hour), Close gives up after the linger time, reporting
// ErrLingerTimeout, or at once with a negative one, and the peer reads the bytes that
// did arrive and then an error, never io.EOF. The ring is a fixed 32 KiB: the 10 KiB
// written while requests are held back fit in it, so Write returns (no credit comes
// back from a peer that never hears of them) and only Close waits.
func TestCloseLingerBound(t *testing.T) {
	for _, linger := range []time.Duration{20 * time.Millisecond, -1} {
		t.Run(linger.String(), func(t *testing.T) {
			f := soft.New(soft.Options{})
			a, b := connPair(t, f, Options{Linger: linger, RingSize: 32 << 10, GrowRingTo: -1})
			first := streamBytes(8, 10<<10)
			_, err := a.Write(first)
			require.NoError(t, err)
			got := make([]byte, len(first))
			_, err = io.ReadFull(b, got)
			require.NoError(t, err)
			require.Equal(t, first, got)

			require.NoError(t, f.DelayQP(a.ep.qp, time.Hour))
			_, err = a.Write(streamBytes(9, 10<<10))
			require.NoError(t, err)
			// Only the linger time can end this Close, and it says the bytes may be lost;
			// a negative linger means the caller chose not to wait, or to know.
			if err := a.Close(); linger < 0 {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrLingerTimeout)
			}

			n, err := b.Read(got)
			require.Error(t, err, "read %d bytes after the last that arrived", n)
			require.NotErrorIs(t, err, io.EOF, "the peer sees a clean end of a truncated stream")
			require.ErrorIs(t, err, ErrControlLost)
			require.NoError(t, b.Close())
			requireReleased(t, f)
		})
	}
}

// blockingWriter hands each slice it is given to the test and waits for the test's go
// ahead before it returns, so the test can act while WriteTo holds ring memory.
type blockingWriter struct {
	got  chan []byte
	next chan struct{}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.got <- p
	<-w.next
	return len(p), nil
}

// TestCloseDuringWriteTo: Close returns while a WriteTo is handing ring memory to its
// writer, and the registered memory stays alive under it (on a real device it would be
// unmapped): the endpoint is released when the WriteTo ends, not before.
func TestCloseDuringWriteTo(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	msg := streamBytes(3, 1000)
	_, err := a.Write(msg)
	require.NoError(t, err)

	w := &blockingWriter{got: make(chan []byte), next: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := b.WriteTo(w)
		done <- err
	}()
	held := <-w.got // WriteTo is now inside w.Write with a slice of b's ring
	require.True(t, bytes.Equal(msg, held), "WriteTo handed %d bytes, want the %d written", len(held), len(msg))

	before := f.Stats()
	require.NoError(t, b.Close())
	after := f.Stats()
	require.Equal(t, before.MRs, after.MRs, "b's registered memory was released while WriteTo still held it")
	require.True(t, bytes.Equal(msg, held), "ring memory changed under WriteTo after Close")

	close(w.next)
	require.ErrorIs(t, <-done, net.ErrClosed)
	require.NoError(t, a.Close())
	requireReleased(t, f)
}

// TestCloseReportsUndelivered: a Conn that failed while bytes Write accepted were still
// unacknowledged returns that failure from Close, so that the application learns they
// may be lost. (A Close after every byte was acknowledged returns nil: every other
// test that closes a healthy Conn checks that.)
func TestCloseReportsUndelivered(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	require.NoError(t, f.BreakQP(b.ep.qp))
	_, err := a.Write(streamBytes(3, 4<<10))
	require.NoError(t, err, "accepted: the failure is not known yet")
	// The write's retries run out (about half a second): a fails.
	_, err = a.Read(make([]byte, 1))
	require.ErrorIs(t, err, ErrQPFailed)
	err = a.Close()
	require.ErrorIs(t, err, ErrQPFailed, "Close after bytes were lost")
	require.ErrorContains(t, err, "never acknowledged by the peer")
	b.Close()
	requireReleased(t, f)
}

// TestCloseWithFakeQP drives Close on a Conn over a fake QP, in a synctest bubble (the
// linger timer runs on the bubble's clock): it posts a FIN after the data, signaled,
// and returns once that FIN completes; it gives up after the linger time, or at once
// with a negative one; it reports a failure that left work requests unacknowledged,
// and not one after everything was; a peer that is gone is not waited for. Every way,
// the QP goes to ERROR, the control channel closes, the endpoint is released, and a
// second Close, like every other method, reports net.ErrClosed.
func TestCloseWithFakeQP(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name      string
		linger    time.Duration
		before    func(t *testing.T, c *Conn) // after a Write of "data", before Close
		ackFIN    bool                        // complete the FIN while Close waits
		failFIN   bool                        // fail the Conn while Close waits for the FIN
		wantKinds []flowctl.Kind              // posted by the end
		wantErr   error
		wantText  string
		wantToErr int  // QP moves to ERROR: a failure's only (teardown destroys it: see TestCloseFlushesNothing)
		parks     bool // Close parks for the FIN, and only then makes its channel
	}{
		{name: "FIN acknowledged", linger: time.Minute, ackFIN: true, parks: true,
			wantKinds: []flowctl.Kind{flowctl.KindData, flowctl.KindFIN}},
		{name: "linger time passes", linger: 20 * time.Millisecond, parks: true,
			wantKinds: []flowctl.Kind{flowctl.KindData, flowctl.KindFIN}, wantErr: ErrLingerTimeout,
			wantText: "within the linger time of 20ms"},
		{name: "negative linger", linger: -1,
			wantKinds: []flowctl.Kind{flowctl.KindData, flowctl.KindFIN}},
		{name: "failed with a write unacknowledged", linger: time.Minute,
			before: func(t *testing.T, c *Conn) {
				c.mu.Lock()
				c.failLocked(qpError("completion", boom))
				c.mu.Unlock()
			},
			wantKinds: []flowctl.Kind{flowctl.KindData}, wantErr: boom,
			wantText: "1 work requests (writes or the FIN) never acknowledged", wantToErr: 1},
		{name: "failed after every write was acknowledged", linger: time.Minute,
			before: func(t *testing.T, c *Conn) {
				c.onSendDone(0) // the data WR, completed
				c.mu.Lock()
				c.failLocked(qpError("completion", boom))
				c.mu.Unlock()
			},
			wantKinds: []flowctl.Kind{flowctl.KindData}, wantToErr: 1},
		{name: "failed with only the FIN unacknowledged", linger: time.Minute,
			before:    func(t *testing.T, c *Conn) { c.onSendDone(0) }, // the data WR, completed
			failFIN:   true,
			parks:     true,
			wantKinds: []flowctl.Kind{flowctl.KindData, flowctl.KindFIN}},
		{name: "peer gone", linger: time.Minute,
			before:    func(t *testing.T, c *Conn) { c.controlLost(io.EOF) },
			wantKinds: []flowctl.Kind{flowctl.KindData, flowctl.KindFIN}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := &fakeQP{}
				c := closableFakeConn(t, q, tt.linger)
				_, err := c.Write([]byte("data"))
				require.NoError(t, err)
				if tt.before != nil {
					tt.before(t, c)
				}
				done := make(chan error, 1)
				go func() { done <- c.Close() }()
				synctest.Wait() // Close is waiting for the FIN, or has returned
				parked := c.poll.parked.Load()
				if tt.ackFIN {
					wrs := q.posted()
					fin := wrs[len(wrs)-1]
					require.NotZero(t, fin.Flags&verbs.SendSignaled, "the FIN is signaled, so Close can wait for it")
					c.onCompletion(sendDone(fin.ID))
				}
				if tt.failFIN {
					c.mu.Lock()
					c.failLocked(qpError("completion", boom))
					c.mu.Unlock()
				}
				err = <-done
				if tt.wantErr == nil {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, tt.wantErr)
					require.ErrorContains(t, err, tt.wantText)
				}
				require.Equal(t, tt.wantKinds, postedKinds(t, q), "posted")
				require.Equal(t, tt.wantToErr, q.toErrors(), "QP moves to ERROR")
				c.mu.Lock()
				require.Equal(t, tt.parks, c.drained != nil, "Close made the channel it parks on")
				c.mu.Unlock()
				// A parked Close is counted as the poller's parked waiter (nudge.go),
				// and no longer once it returned.
				require.Equal(t, tt.parks, parked == 1, "counted parked while Close waited")
				require.Zero(t, c.poll.parked.Load(), "counted parked after Close")
				require.True(t, released(c), "the endpoint was not released")
				_, err = c.ctrl.Write([]byte{'K'})
				require.ErrorIs(t, err, io.ErrClosedPipe, "the control channel is open")

				require.ErrorIs(t, c.Close(), net.ErrClosed, "second Close")
				require.ErrorIs(t, c.CloseWrite(), net.ErrClosed, "CloseWrite after Close")
				require.ErrorIs(t, c.SetDeadline(time.Time{}), net.ErrClosed, "SetDeadline after Close")
				_, err = c.Read(make([]byte, 1))
				require.ErrorIs(t, err, net.ErrClosed, "Read after Close")
				_, err = c.Write([]byte("x"))
				require.ErrorIs(t, err, net.ErrClosed, "Write after Close")
				require.Equal(t, tt.wantToErr, q.toErrors(), "QP moves to ERROR after the second Close")
			})
		})
	}
}

// TestCloseWakesWaiters: a Read with nothing to read and a Write with the send queue
// full, both parked, return net.ErrClosed when Close is called.
func TestCloseWakesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &fakeQP{}
		c := closableFakeConn(t, q, -1)
		for range fakeSQDepth - 1 { // a data post may take two WRs: depth-1 fill the queue
			_, err := c.Write([]byte("x"))
			require.NoError(t, err)
		}
		readErr, writeErr := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 8))
			readErr <- err
		}()
		go func() {
			_, err := c.Write([]byte("y"))
			writeErr <- err
		}()
		synctest.Wait()
		select {
		case err := <-readErr:
			t.Fatalf("Read returned %v before Close", err)
		case err := <-writeErr:
			t.Fatalf("Write returned %v before Close", err)
		default:
		}
		require.NoError(t, c.Close())
		require.ErrorIs(t, <-readErr, net.ErrClosed)
		require.ErrorIs(t, <-writeErr, net.ErrClosed)
	})
}

// TestCloseWriteWithFakeQP: CloseWrite posts one signaled FIN after the data, however
// often it is called; later Writes fail, and Reads go on until the peer's FIN.
func TestCloseWriteWithFakeQP(t *testing.T) {
	q := &fakeQP{}
	c := newFakeConn(t, q)
	_, err := c.Write([]byte("data"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	require.NoError(t, c.CloseWrite())
	require.Equal(t, []flowctl.Kind{flowctl.KindData, flowctl.KindFIN}, postedKinds(t, q))
	wrs := q.posted()
	require.NotZero(t, wrs[1].Flags&verbs.SendSignaled, "the FIN is signaled")
	_, err = c.Write([]byte("more"))
	require.ErrorIs(t, err, os.ErrClosed, "Write after CloseWrite")

	arrive(t, c, 0, flowctl.KindData, 0, "reply")
	arrive(t, c, 1, flowctl.KindFIN, 0, "")
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "reply", string(got))
}

// TestCloseDuringWriteToWithFakeQP: Close returns while a WriteTo is handing ring memory
// to its writer, and leaves the endpoint to it: the WriteTo releases it when it ends.
func TestCloseDuringWriteToWithFakeQP(t *testing.T) {
	q := &fakeQP{}
	c := closableFakeConn(t, q, -1)
	arrive(t, c, 0, flowctl.KindData, 0, "ring bytes")
	w := &blockingWriter{got: make(chan []byte), next: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := c.WriteTo(w)
		done <- err
	}()
	held := <-w.got
	require.Equal(t, "ring bytes", string(held))
	require.NoError(t, c.Close())
	require.False(t, released(c), "the endpoint was released under WriteTo")
	close(w.next)
	require.ErrorIs(t, <-done, net.ErrClosed)
	require.True(t, released(c), "WriteTo ended without releasing the endpoint")
}

// TestAbandonWithFakeQP: Abandon tears down without a FIN and leaves the control
// channel open (it is the caller's); a Close after it reports net.ErrClosed.
func TestAbandonWithFakeQP(t *testing.T) {
	q := &fakeQP{}
	c := closableFakeConn(t, q, time.Minute)
	require.NoError(t, c.Abandon())
	require.Empty(t, q.posted(), "Abandon posted")
	require.Zero(t, q.toErrors(), "QP moved to ERROR: nothing is left in the ring, so teardown destroys it")
	require.True(t, released(c))
	require.NoError(t, c.ctrl.SetDeadline(time.Time{}), "the control channel was closed")
	require.ErrorIs(t, c.Close(), net.ErrClosed)
}

// closeGate is a control channel whose Close waits until the test opens the gate, as
// a socket's close waits for the read still in it to leave.
type closeGate struct {
	net.Conn
	entered chan struct{} // closed when Close begins
	open    chan struct{} // closed by the test to let Close through
	once    sync.Once
}

func (g *closeGate) Close() error {
	g.once.Do(func() { close(g.entered) })
	<-g.open
	return g.Conn.Close()
}

// TestCloseLeavesControlToReader checks that Close returns once its bytes are settled
// and its QP is torn down, without waiting for the control channel to close: the
// control reader closes it, after Close has returned, and the peer then sees the end
// of the stream and of the channel as before.
func TestCloseLeavesControlToReader(t *testing.T) {
	f := soft.New(soft.Options{})
	ca, cb := tcpPair(t)
	gate := &closeGate{Conn: ca, entered: make(chan struct{}), open: make(chan struct{})}
	a, b := connPairOver(t, f, loopback.String(), loopback.String(), Options{}, gate, cb)

	_, err := a.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, a.Close(), "Close with the control channel's close held up")
	a.mu.Lock()
	closing := a.closing
	a.mu.Unlock()
	require.True(t, closing, "Close returned before it began")
	<-gate.entered   // the control reader, not Close, is closing the channel
	close(gate.open) // and then ends: TestMain's goleak checks that it did

	got, err := io.ReadAll(b)
	require.NoError(t, err)
	require.Equal(t, "last words", string(got))
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestCloseFlushesNothing: a Close with nothing left in the ring or the staging buffer
// destroys its QP without moving it to ERROR first, so none of its posted receive WQEs
// is flushed into the CQ for the poller to reap and drop; both ends, and the device's
// count of flushed WQEs stays at zero. (A Close during a Read or WriteTo still moves
// the QP to ERROR: TestCloseDuringWriteToWithFakeQP.)
func TestCloseFlushesNothing(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	closeAfterLastWords(t, a, b)
	require.NoError(t, b.Close())
	require.Zero(t, f.Stats().Flushed, "receive WQEs flushed by two Closes")
	requireReleased(t, f)
}

// closeAfterLastWords writes a few bytes on a and closes it, then reads b to its end
// and checks that the bytes arrived: the peer's Close, before b's own.
func closeAfterLastWords(t *testing.T, a, b *Conn) {
	t.Helper()
	_, err := a.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, a.Close())
	got, err := io.ReadAll(b)
	require.NoError(t, err)
	require.Equal(t, "last words", string(got))
}
