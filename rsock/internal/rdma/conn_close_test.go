package rdma

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
