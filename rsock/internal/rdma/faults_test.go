package rdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// This file holds the fault tests: each moves a verified stream in both directions while
// a fault strikes, checks the error each side's application sees, checks that a
// bystander connection sharing the CQ is unaffected, and checks that every resource
// is released. docs: rsock/FAILURES.md lists them.

// faultFabric has two devices, soft0 (127.0.0.1) and soft1 (127.0.0.2), and timers
// scaled down so retry budgets run out in milliseconds.
func faultFabric() *soft.Fabric {
	return soft.New(soft.Options{Devices: 2, TimeScale: 0.01})
}

// connPairIPs connects a Conn on the device of ipA to one on the device of ipB.
func connPairIPs(t testing.TB, p verbs.Provider, ipA, ipB string, opts Options) (*Conn, *Conn) {
	ca, cb := tcpPair(t)
	return connPairOver(t, p, ipA, ipB, opts, ca, cb)
}

// connPairOver is connPairIPs with the control channels ca and cb.
func connPairOver(t testing.TB, p verbs.Provider, ipA, ipB string, opts Options, ca, cb net.Conn) (*Conn, *Conn) {
	return connPairOverOpts(t, p, ipA, ipB, opts, opts, ca, cb)
}

// connPairOverOpts is connPairOver with each side's own Options.
func connPairOverOpts(t testing.TB, p verbs.Provider, ipA, ipB string, optsA, optsB Options, ca, cb net.Conn) (*Conn, *Conn) {
	ea, err := Prepare(p, netip.MustParseAddr(ipA), optsA)
	require.NoError(t, err)
	eb, err := Prepare(p, netip.MustParseAddr(ipB), optsB)
	require.NoError(t, err)
	a, err := ea.Connect(eb.Offer(), ca, 0)
	require.NoError(t, err)
	b, err := eb.Connect(ea.Offer(), cb, 0)
	require.NoError(t, err)
	startPair(t, a, b)
	return a, b
}

// streamWriter is the writing end of a verified stream.
type streamWriter interface {
	Write(p []byte) (int, error)
	CloseWrite() error
}

// smallWrites writes in 64-byte Writes, one message each.
type smallWrites struct{ *Conn }

func (w smallWrites) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := w.Conn.Write(p[n:min(len(p), n+64)])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// direction is the outcome of one direction of a verified stream.
type direction struct {
	written  int64 // bytes Write reported written
	read     int64 // bytes read and verified
	writeErr error
	readErr  error // io.EOF for a clean end
}

// verifiedStream writes total bytes of a seeded pseudo-random stream from w to r in
// random-sized writes, verifying every byte r reads against the same stream. It calls
// strike once, after the first half of the bytes is written. A byte that arrives wrong,
// twice or out of order fails the test at once. Readers stop at EOF or the first error.
func verifiedStream(t *testing.T, w streamWriter, r *Conn, seed uint64, total int64, strike func()) direction {
	var d direction
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		want := rand.NewChaCha8(seedBytes(seed))
		buf, exp := make([]byte, 64<<10), make([]byte, 64<<10)
		for {
			n, err := r.Read(buf)
			want.Read(exp[:n])
			if n > 0 && string(buf[:n]) != string(exp[:n]) {
				t.Errorf("stream %d: bytes %d..%d differ from what was written", seed, d.read, d.read+int64(n))
				d.readErr = errors.New("corrupt")
				r.Close() // unblock the writer
				return
			}
			d.read += int64(n)
			if err != nil {
				d.readErr = err
				return
			}
		}
	}()
	src := rand.NewChaCha8(seedBytes(seed))
	sizes := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, 256<<10)
	struck := strike == nil
	for d.written < total {
		p := buf[:min(int64(1+sizes.IntN(len(buf))), total-d.written)]
		src.Read(p)
		n, err := w.Write(p)
		d.written += int64(n)
		if err != nil {
			d.writeErr = err
			break
		}
		if !struck && d.written >= total/2 {
			struck = true
			strike()
		}
	}
	if d.writeErr == nil {
		w.CloseWrite()
	}
	// A reader whose peer failed may wait for data that will never come: the failure
	// or the close below ends it.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		r.SetReadDeadline(time.Now())
		<-done
	}
	return d
}

func seedBytes(seed uint64) [32]byte {
	var b [32]byte
	for i := range 8 {
		b[i] = byte(seed >> (8 * i))
	}
	return b
}

// bystander streams both ways between a and b while fn runs, and requires that nothing
// goes wrong.
func bystander(t *testing.T, a, b *Conn, fn func()) {
	var wg sync.WaitGroup
	var ab, ba direction
	wg.Add(2)
	stop := make(chan struct{})
	go func() { defer wg.Done(); <-stop; ab = verifiedStream(t, a, b, 101, 8<<20, nil) }()
	go func() { defer wg.Done(); <-stop; ba = verifiedStream(t, b, a, 102, 8<<20, nil) }()
	close(stop)
	fn()
	wg.Wait()
	for _, d := range []direction{ab, ba} {
		require.NoError(t, d.writeErr, "bystander write")
		require.ErrorIs(t, d.readErr, io.EOF, "bystander read")
		require.Equal(t, d.written, d.read, "bystander bytes")
	}
}

// requireEndedBy checks that a direction hit by a fault ended with one of the errors
// and delivered a prefix of what was written and no more.
func requireEndedBy(t *testing.T, name string, d direction, errs ...error) {
	t.Helper()
	require.LessOrEqual(t, d.read, d.written, "%s: read more than written", name)
	err := d.writeErr
	if err == nil {
		err = d.readErr
	}
	for _, want := range errs {
		if errors.Is(err, want) || errors.Is(d.readErr, want) {
			return
		}
	}
	t.Fatalf("%s: write error %v, read error %v; want one of %v", name, d.writeErr, d.readErr, errs)
}

// faultCase runs a fault test: a victim pair on soft0–soft1 streaming 32 MiB both ways
// while strike hits it (half way), next to a bystander pair on soft0 that shares the
// victim's CQ.
func faultCase(t *testing.T, strike func(f *soft.Fabric, a, b *Conn), check func(ab, ba direction)) {
	faultCaseOf(t, 32<<20, strike, check)
}

// faultCaseOf is faultCase with total bytes each way.
func faultCaseOf(t *testing.T, total int64, strike func(f *soft.Fabric, a, b *Conn), check func(ab, ba direction)) {
	f := faultFabric()
	opts := Options{RingSize: 16 << 10, SendBufferSize: 16 << 10}
	a, b := connPairIPs(t, f, "127.0.0.1", "127.0.0.2", opts)
	x, y := connPairIPs(t, f, "127.0.0.1", "127.0.0.1", opts)
	require.Same(t, a.ep.poller, x.ep.poller, "the bystander shares the victim's CQ")

	var ab, ba direction
	bystander(t, x, y, func() {
		var wg sync.WaitGroup
		var once sync.Once
		hit := func() { once.Do(func() { strike(f, a, b) }) }
		wg.Add(2)
		go func() { defer wg.Done(); ab = verifiedStream(t, a, b, 1, total, hit) }()
		go func() { defer wg.Done(); ba = verifiedStream(t, b, a, 2, total, hit) }()
		wg.Wait()
	})
	check(ab, ba)
	for _, c := range []*Conn{a, b, x, y} {
		c.Close()
	}
	requireReleased(t, f)
}

func TestFaultLinkBreak(t *testing.T) {
	faultCase(t, func(f *soft.Fabric, a, b *Conn) {
		require.NoError(t, f.BreakLink("soft0", "soft1"))
	}, func(ab, ba direction) {
		requireEndedBy(t, "a→b", ab, ErrQPFailed, ErrControlLost)
		requireEndedBy(t, "b→a", ba, ErrQPFailed, ErrControlLost)
		err := errors.Join(ab.writeErr, ab.readErr, ba.writeErr, ba.readErr)
		require.Contains(t, err.Error(), verbs.WCRetryExcErr.String(), "the error names the retry budget")
	})
}

func TestFaultQPError(t *testing.T) {
	faultCase(t, func(f *soft.Fabric, a, b *Conn) {
		require.NoError(t, f.FailQP(a.ep.qp))
	}, func(ab, ba direction) {
		requireEndedBy(t, "a→b", ab, ErrQPFailed, ErrControlLost)
		requireEndedBy(t, "b→a", ba, ErrQPFailed, ErrControlLost)
		err := errors.Join(ab.writeErr, ba.readErr)
		require.Contains(t, err.Error(), verbs.WCWRFlushErr.String(), "a's error names the flush")
	})
}

func TestFaultPeerDeath(t *testing.T) {
	// b's process dies: its QP goes to ERROR with the device's cleanup and the kernel
	// resets its bootstrap socket.
	faultCase(t, func(f *soft.Fabric, a, b *Conn) {
		b.ctrl.(*net.TCPConn).SetLinger(0)
		b.ctrl.Close()
		f.FailQP(b.ep.qp)
	}, func(ab, ba direction) {
		requireEndedBy(t, "a→b", ab, ErrQPFailed, ErrControlLost, ErrPeerClosed)
		requireEndedBy(t, "b→a", ba, ErrQPFailed, ErrControlLost)
	})
}

func TestFaultDelayedDelivery(t *testing.T) {
	// A slow fabric is not a fault: everything arrives. The 4 MiB each way that cross
	// the slowed link are still hundreds of 16 KiB rings; the 16 MiB of a 32 MiB case
	// took three times as long.
	faultCaseOf(t, 8<<20, func(f *soft.Fabric, a, b *Conn) {
		require.NoError(t, f.DelayLink("soft0", "soft1", 200*time.Microsecond))
	}, func(ab, ba direction) {
		for _, d := range []direction{ab, ba} {
			require.NoError(t, d.writeErr)
			require.ErrorIs(t, d.readErr, io.EOF)
			require.Equal(t, d.written, d.read)
		}
	})
}

// TestFaultRNRStorm starves a receiver of WQEs: b claims more receive WQEs than it
// posts, so a's writes outrun b's receive queue and meet receiver-not-ready NAKs. With
// rnr_retry 7 the fabric retries them until b's poller re-posts, so the storm ends in
// transparent recovery (every byte arrives, in order, once) or, if b's flow control
// sees a exceed its real grant, in a protocol error; never in corruption.
func TestFaultRNRStorm(t *testing.T) {
	f := faultFabric()
	opts := Options{RingSize: 1 << 20, SendBufferSize: 64 << 10, SendWQEs: 1024, RecvWQEs: MinRecvWQEs, PollSpin: -1}
	ca, cb := tcpPair(t)
	ea, err := Prepare(f, loopback, opts)
	require.NoError(t, err)
	eb, err := Prepare(f, loopback, opts)
	require.NoError(t, err)
	lie := eb.Offer()
	lie.RecvWQEs, lie.GrowRecvWQEsTo = 512, 512
	a, err := ea.Connect(lie, ca, 0)
	require.NoError(t, err)
	b, err := eb.Connect(ea.Offer(), cb, 0)
	require.NoError(t, err)
	startPair(t, a, b)

	// Many small writes, each a message, outrun the receiver's eight WQEs.
	d := verifiedStream(t, smallWrites{a}, b, 7, 4<<20, nil)
	require.Positive(t, f.Stats().RNRNAKs, "the receiver was starved")
	if d.writeErr == nil && errors.Is(d.readErr, io.EOF) {
		require.Equal(t, d.written, d.read)
	} else {
		requireEndedBy(t, "a→b", d, ErrProtocol)
	}
	t.Logf("%d RNR NAKs; writer %v, reader %v after %d of %d bytes", f.Stats().RNRNAKs, d.writeErr, d.readErr, d.read, d.written)
	a.Close()
	b.Close()
	requireReleased(t, f)
}

// TestFaultStalledReader: the reader stops; the writer blocks once the ring and the
// reader's spill buffer fill, its deadline fires, and the bytes it reported written all
// arrive when the reader resumes, followed by the rest. The ring is fixed: a growing
// one may grow while its reader is stalled (conn_resize.go), by how far depending on
// when its old rings spill, and a 1 MiB Write then fits.
func TestFaultStalledReader(t *testing.T) {
	f := soft.New(soft.Options{})
	const ring, spill = 16 << 10, 64 << 10
	a, b := connPair(t, f, Options{RingSize: ring, GrowRingTo: -1, SendBufferSize: 8 << 10, ReadBufferSize: spill})
	src := rand.NewChaCha8(seedBytes(9))
	msg := make([]byte, 1<<20)
	src.Read(msg)
	// The deadline decides when the writer counts as blocked; a generous one only
	// gives the spilling more time.
	a.SetWriteDeadline(time.Now().Add(time.Second))
	n, err := a.Write(msg)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Less(t, n, len(msg), "the writer blocked")
	require.GreaterOrEqual(t, n, spill+ring/2, "the writer blocked before the spill buffer was full")

	a.SetWriteDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := a.Write(msg[n:])
		if err == nil {
			err = a.CloseWrite()
		}
		done <- err
	}()
	got, err := io.ReadAll(b)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, len(msg), len(got))
	require.True(t, string(msg) == string(got), "stream differs")
	a.Close()
	b.Close()
	requireReleased(t, f)
}

// TestFaultCloseRacesWrites closes a Conn while its writer is in the middle of large
// writes: the writer gets net.ErrClosed, and the peer receives exactly the bytes the
// writer was told were written, then EOF.
func TestFaultCloseRacesWrites(t *testing.T) {
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			f := soft.New(soft.Options{})
			a, b := connPair(t, f, Options{RingSize: 16 << 10, SendBufferSize: 8 << 10})
			closed := make(chan error, 1)
			go func() {
				// Staggers Close across the stream to land at different points of it;
				// the assertions hold wherever it lands.
				time.Sleep(time.Duration(i) * time.Millisecond)
				closed <- a.Close()
			}()
			d := verifiedStream(t, a, b, uint64(i), 64<<20, nil)
			require.NoError(t, <-closed)
			require.ErrorIs(t, d.writeErr, net.ErrClosed)
			require.ErrorIs(t, d.readErr, io.EOF, "the peer sees a clean end")
			require.Equal(t, d.written, d.read, "bytes reported written = bytes received")
			b.Close()
			requireReleased(t, f)
		})
	}
}

func TestFaultErrorsNameCause(t *testing.T) {
	// The text an application logs says what happened, layer by layer.
	err := qpError("completion", (&verbs.WorkCompletion{Status: verbs.WCRetryExcErr, QPN: 0x11, WRID: 3}).Err())
	require.True(t, strings.HasPrefix(err.Error(), "rdma: queue pair failed: completion: verbs: QP 0x11"), err.Error())
	require.ErrorIs(t, err, ErrQPFailed)
	var wcErr *verbs.WCError
	require.ErrorAs(t, err, &wcErr)
	require.Equal(t, verbs.WCRetryExcErr, wcErr.Status)
}

// TestFaultCQOverflow overfills a shared CQ. The engine sizes CQs so this cannot
// happen (each QP reserves its send and receive depth), so the test forges the
// reservation: the victims' poller claims room it lacks. When the CQ overflows, every
// connection on it fails with ErrCQFailed, and a connection on another CQ carries on.
func TestFaultCQOverflow(t *testing.T) {
	f := faultFabric()
	// A bystander on a CQ of its own, created first.
	x, y := connPairIPs(t, f, "127.0.0.2", "127.0.0.2", Options{})
	// The victims' CQ holds 16 entries but admits QPs needing 64 each.
	opts := Options{RingSize: 64 << 10, SendBufferSize: 16 << 10, RecvWQEs: 32, SendWQEs: 32, CQSize: 16}
	dev, _, err := acquireDevice(context.Background(), f, loopback, verbs.Selector{})
	require.NoError(t, err)
	p, err := dev.pollerFor(0, opts.CQSize, 0)
	require.NoError(t, err)
	p.capacity = 1 << 20 // the forged reservation
	a, b := connPairIPs(t, f, "127.0.0.1", "127.0.0.1", opts)
	require.Same(t, p, a.ep.poller)
	require.NotSame(t, p, x.ep.poller)

	var ab direction
	bystander(t, x, y, func() {
		ab = verifiedStream(t, smallWrites{a}, b, 3, 4<<20, nil)
	})
	requireEndedBy(t, "a→b", ab, ErrCQFailed, ErrQPFailed, ErrControlLost)
	for _, c := range []*Conn{a, b} {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		require.ErrorIs(t, err, ErrCQFailed, "a connection on the overflowed CQ")
		require.ErrorIs(t, err, verbs.ErrCQOverflow)
	}
	for _, c := range []*Conn{a, b, x, y} {
		c.Close()
	}
	require.NoError(t, dev.release())
	requireReleased(t, f)
}
