package rdma

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/soft"
)

// placeStats returns c's flow-control counts.
func placeStats(c *Conn) flowctl.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fc.Stats()
}

// advertPending reports whether c has an advertisement under way.
func advertPending(c *Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fc.AdvertPending()
}

// readAllWith reads from r into buffers of size bytes until EOF, appending what it reads.
func readAllWith(r *Conn, size int) ([]byte, error) {
	var got []byte
	buf := make([]byte, size)
	for {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
	}
}

// placeable waits until w may place into its peer's advertisement, for up to 10 s,
// and reports whether it may. It may run on a writer's goroutine.
func placeable(w *Conn) bool {
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(50 * time.Microsecond) {
		w.mu.Lock()
		ok := w.fc.Placeable() > 0
		w.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

var errNoAdvert = errors.New("no usable advertisement within 10 s")

// TestPlaceStream moves streams whose Reads are large enough to advertise, with Writes
// of mixed sizes (some placed, some through the ring, some split between the two), and
// checks every byte. Where direct Writes no larger than the Reads wait for the
// reader's advertisement (lockstep), every one of them is placed whole; where either
// side cannot place, none is.
// Otherwise whether an advertisement is placed into depends on timing: the test counts
// only that the writer placed what the reader took.
func TestPlaceStream(t *testing.T) {
	const unknown, none, all = -1, 0, 1
	tests := []struct {
		name     string
		readSize int
		maxWrite int
		total    int
		opts     [2]Options // writer's, reader's
		lockstep bool
		placed   int
	}{
		{"large writes", 256 << 10, 512 << 10, 16 << 20, [2]Options{}, false, unknown},
		{"mixed writes", 128 << 10, 200 << 10, 8 << 20, [2]Options{}, false, unknown},
		{"small writes into large reads", 1 << 20, 8 << 10, 4 << 20, [2]Options{}, false, unknown},
		{"lockstep", 256 << 10, 256 << 10, 4 << 20, [2]Options{}, true, all},
		{"reads too small to advertise", placeMinRead - 1, 256 << 10, 4 << 20, [2]Options{}, false, none},
		{"writer without placement", 256 << 10, 512 << 10, 4 << 20, [2]Options{{NoPlacement: true}, {}}, false, none},
		{"reader without placement", 256 << 10, 512 << 10, 4 << 20, [2]Options{{}, {NoPlacement: true}}, false, none},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			w, r := connPairOpts(t, f, tt.opts[0], tt.opts[1])
			p := streamBytes(uint64(i), tt.total)
			var wg sync.WaitGroup
			var werr error
			writes := 0
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), 2))
				for off := 0; off < len(p); {
					n := min(1+rng.IntN(tt.maxWrite), len(p)-off)
					if tt.lockstep {
						// Direct Writes, no larger than the Reads: each is placed whole.
						n = min(directMinWrite+rng.IntN(tt.maxWrite-directMinWrite+1), len(p)-off)
					}
					if tt.lockstep && !placeable(w) {
						werr = errNoAdvert
						w.Close() // and the reader returns
						return
					}
					writes++
					if _, werr = w.Write(p[off : off+n]); werr != nil {
						return
					}
					off += n
				}
				werr = w.CloseWrite()
			})
			got, err := readAllWith(r, tt.readSize)
			wg.Wait()
			require.NoError(t, werr)
			require.NoError(t, err)
			require.True(t, bytes.Equal(p, got), "the stream differs (%d bytes of %d read)", len(got), len(p))
			placed := placeStats(r).PlacedReceived
			require.Equal(t, placeStats(w).PlacedSent, placed, "placements sent and received")
			switch tt.placed {
			case all:
				require.EqualValues(t, writes, placed, "placements: one per Write")
			case none:
				require.Zero(t, placed, "placements")
			}
			require.False(t, advertPending(r), "an advertisement left unanswered")
			require.NoError(t, w.Close())
			require.NoError(t, r.Close())
			requireReleased(t, f)
		})
	}
}

// connPairOpts is connPair with each side's own Options.
func connPairOpts(t *testing.T, f *soft.Fabric, wOpts, rOpts Options) (*Conn, *Conn) {
	t.Helper()
	ca, cb := tcpPair(t)
	return connPairOverOpts(t, f, loopback.String(), loopback.String(), wOpts, rOpts, ca, cb)
}

// TestPlaceDeadline: a Read whose deadline passes while its buffer is advertised
// withdraws the advertisement before it returns (the peer answers the cancel), and
// what the peer writes afterwards arrives through the ring, whole, to the next Read.
func TestPlaceDeadline(t *testing.T) {
	f := soft.New(soft.Options{})
	w, r := connPair(t, f, Options{})
	type result struct {
		n   int
		err error
	}
	done := make(chan result)
	buf := make([]byte, 1<<20)
	go func() {
		n, err := r.Read(buf)
		done <- result{n, err}
	}()
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.place.expect // the advertisement reached the writer
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, r.SetReadDeadline(aLongTimeAgo))
	res := <-done
	require.ErrorIs(t, res.err, os.ErrDeadlineExceeded)
	require.Zero(t, res.n)
	require.False(t, advertPending(r), "the Read returned with its advertisement unanswered")
	require.NoError(t, r.SetReadDeadline(time.Time{}))

	p := streamBytes(3, 300<<10)
	go func() {
		w.Write(p)
		w.CloseWrite()
	}()
	got, err := readAllWith(r, len(buf))
	require.NoError(t, err)
	require.True(t, bytes.Equal(p, got), "the stream after the deadline differs")
	require.NoError(t, w.Close())
	require.NoError(t, r.Close())
	requireReleased(t, f)
}

// TestPlaceDeadlineRace: deadlines that pass while the writer is placing lose and
// duplicate nothing: each Read returns bytes or the deadline, and the bytes read, in
// order, are the bytes written.
func TestPlaceDeadlineRace(t *testing.T) {
	f := soft.New(soft.Options{})
	w, r := connPair(t, f, Options{})
	p := streamBytes(4, 8<<20)
	go func() {
		rng := rand.New(rand.NewPCG(4, 4))
		for off := 0; off < len(p); {
			n := min(64<<10+rng.IntN(512<<10), len(p)-off)
			if _, err := w.Write(p[off : off+n]); err != nil {
				return
			}
			off += n
		}
		w.CloseWrite()
	}()
	var got []byte
	buf := make([]byte, 256<<10)
	deadlines := 0
	for i := 0; ; i++ {
		if i%3 == 0 {
			// A deadline that passes at once, or about when the Read advertises.
			r.SetReadDeadline(time.Now().Add(time.Duration(i%7) * time.Microsecond))
		} else {
			r.SetReadDeadline(time.Time{})
		}
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			require.Zero(t, n, "bytes with an error")
			deadlines++
		}
	}
	require.True(t, bytes.Equal(p, got), "the stream differs (%d bytes of %d)", len(got), len(p))
	require.False(t, advertPending(r))
	t.Logf("%d deadlines, %d placements", deadlines, placeStats(r).PlacedReceived)
	require.NoError(t, w.Close())
	require.NoError(t, r.Close())
	requireReleased(t, f)
}

// TestPlaceClose: Close while a Read's buffer is advertised ends the Read with
// net.ErrClosed once nothing more can land in it, and leaves nothing registered.
func TestPlaceClose(t *testing.T) {
	for _, name := range []string{"reader closes", "writer closes"} {
		t.Run(name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			w, r := connPair(t, f, Options{Linger: -1})
			done := make(chan error)
			go func() {
				_, err := r.Read(make([]byte, 1<<20))
				done <- err
			}()
			require.Eventually(t, func() bool { return advertPending(r) }, 10*time.Second, time.Millisecond)
			if name == "reader closes" {
				require.NoError(t, r.Close())
				require.ErrorIs(t, <-done, net.ErrClosed)
				require.NoError(t, w.Close())
			} else {
				require.NoError(t, w.Close())
				require.ErrorIs(t, <-done, io.EOF, "the FIN answers the advertisement")
				require.NoError(t, r.Close())
			}
			requireReleased(t, f)
		})
	}
}

// TestPlaceNotWherePinned: an endpoint whose provider pins memory does not offer
// direct placement, so its Reads never advertise and its peer never writes into their
// buffers. It runs on soft made to pin and, where this build has one and the machine a
// device (the Soft-RoCE VM), on the default provider.
func TestPlaceNotWherePinned(t *testing.T) {
	f := soft.New(soft.Options{})
	type provider struct {
		name string
		p    verbs.Provider
		f    *soft.Fabric // for the release check, or nil
	}
	provs := []provider{{"soft-pinning", &pinningRegProvider{Fabric: f}, f}}
	if p, err := auto.Default(); err == nil {
		provs = append(provs, provider{"default-" + p.Name(), p, nil})
	} else {
		t.Logf("no default provider here, soft only: %v", err)
	}
	for _, pv := range provs {
		t.Run(pv.name, func(t *testing.T) {
			w, r := connPair(t, pv.p, Options{}) // on a device, it must hold a GID for 127.0.0.1
			require.False(t, w.Placing(), "the writer places")
			require.False(t, r.Placing(), "the reader places")
			data := streamBytes(5, 8<<20)
			go func() {
				for off := 0; off < len(data); off += 1 << 20 {
					if _, err := w.Write(data[off : off+1<<20]); err != nil {
						return
					}
				}
				w.CloseWrite()
			}()
			got, err := readAllWith(r, 1<<20)
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, got), "the stream differs")
			require.Zero(t, placeStats(r).PlacedReceived, "placements")
			require.NoError(t, w.Close())
			require.NoError(t, r.Close())
			if pv.f != nil {
				requireReleased(t, pv.f)
			}
		})
	}
}

// advertOnFake hands c, a fake Conn that can place, the peer's advertisement of a
// buffer of units PlaceUnits at addr with rkey, continuing the stream at cursor lo32.
func advertOnFake(t *testing.T, c *Conn, wqe uint64, addr uint64, rkey, lo32 uint32, units uint32) {
	t.Helper()
	c.mu.Lock()
	c.place.reg = &fakeRegistrar{}
	putRingDesc(c.ep.ring.Bytes()[c.fc.RingSize()+mailboxPlace:], addr, rkey, lo32)
	c.mu.Unlock()
	arriveImm(t, c, wqe, flowctl.Imm{Kind: flowctl.KindPlace, Op: flowctl.PlaceAdvert, PlaceUnits: units}, flowctl.AdvertLen)
}

// placeOp decodes the placement operation of a posted WR's immediate, failing the test
// for another kind.
func placeOp(t *testing.T, imm uint32, byteLen int) flowctl.PlaceOp {
	t.Helper()
	m, err := flowctl.DecodeImm(imm, uint32(byteLen))
	require.NoError(t, err)
	require.Equal(t, flowctl.KindPlace, m.Kind)
	return m.Op
}

// TestPlaceWriteOnFake: a Write that finds the peer's advertisement usable writes its
// first bytes into the advertised buffer, from its start, in one signaled write with
// the placement's immediate, and the rest to the ring; one whose cursor this side has
// written past is declined; one naming a cursor never written fails the connection.
func TestPlaceWriteOnFake(t *testing.T) {
	const addr, rkey = 0xbeef0000, 0x51
	t.Run("placed", func(t *testing.T) {
		c, q := resizingConn(t)
		advertOnFake(t, c, 0, addr, rkey, 0, 1) // 4 KiB at cursor 0
		require.NoError(t, connErr(c))
		p := streamBytes(7, 6<<10)
		n, err := c.Write(p)
		require.NoError(t, err)
		require.Equal(t, len(p), n)
		wrs := q.posted()
		require.Len(t, wrs, 2, "the placement, then the rest to the ring")
		pl := wrs[0]
		require.Equal(t, uint64(addr), pl.RemoteAddr, "placed at the buffer's start")
		require.Equal(t, uint32(rkey), pl.RKey)
		require.Equal(t, flowctl.PlacePlaced, placeOp(t, pl.Imm, int(pl.SGL[0].Length)))
		require.NotZero(t, pl.Flags&verbs.SendSignaled, "signaled")
		require.Equal(t, p[:flowctl.PlaceUnit], staged(c, pl.SGL[0]), "the first 4 KiB placed")
		data := wrs[1]
		require.Equal(t, c.peerRingAddr, data.RemoteAddr, "the rest at the ring's start: placement moved no cursor")
		require.Equal(t, p[flowctl.PlaceUnit:], staged(c, data.SGL[0]))
	})
	t.Run("written past", func(t *testing.T) {
		c, q := resizingConn(t)
		_, err := c.Write([]byte("before the advertisement"))
		require.NoError(t, err)
		advertOnFake(t, c, 0, addr, rkey, 0, 1) // the peer had not seen those bytes
		require.NoError(t, connErr(c))
		wrs := q.posted()
		last := wrs[len(wrs)-1]
		require.Equal(t, flowctl.PlaceDecline, placeOp(t, last.Imm, 0), "declined at once")
		_, err = c.Write(streamBytes(8, 6<<10))
		require.NoError(t, err)
		for _, wr := range q.posted()[len(wrs):] {
			require.NotEqual(t, uint64(addr), wr.RemoteAddr, "placed into a declined buffer")
		}
	})
	t.Run("cursor never written", func(t *testing.T) {
		c, _ := resizingConn(t)
		advertOnFake(t, c, 0, addr, rkey, 100, 1)
		require.ErrorIs(t, connErr(c), ErrProtocol)
		require.ErrorIs(t, connErr(c), flowctl.ErrBadPlace)
	})
	t.Run("cancel", func(t *testing.T) {
		c, q := resizingConn(t)
		advertOnFake(t, c, 0, addr, rkey, 0, 1)
		before := len(q.posted())
		arriveImm(t, c, 1, flowctl.Imm{Kind: flowctl.KindPlace, Op: flowctl.PlaceCancel}, 0)
		wrs := q.posted()
		require.Len(t, wrs, before+1)
		require.Equal(t, flowctl.PlaceDecline, placeOp(t, wrs[before].Imm, 0), "the cancel is answered")
	})
}

// TestPlaceWriteAwaitsAdvertOnFake: a large Write toward a peer whose Reads advertise
// (expect) waits for the next advertisement, spinning, and places into it when it
// comes; without that expectation it goes to the ring at once.
func TestPlaceWriteAwaitsAdvertOnFake(t *testing.T) {
	const addr, rkey = 0xbeef0000, 0x51
	for _, expect := range []bool{true, false} {
		t.Run(fmt.Sprintf("expect=%v", expect), func(t *testing.T) {
			p := newFakeProvider()
			// A spin that does not end while the test looks.
			c, _ := fakeConnPair(t, p, loopback, loopback, Options{PollSpin: 1 << 30, Linger: -1})
			q := &fakeQP{qpn: c.qp.QPN()}
			c.qp = q
			c.mu.Lock()
			c.place.reg, c.place.expect = &fakeRegistrar{}, expect
			c.mu.Unlock()
			go c.Write(make([]byte, placeMinRead)) // the fake peer returns no credit: Close ends it
			if expect {
				require.Eventually(t, func() bool { return c.poll.spinners.Load() > 0 }, 10*time.Second, time.Millisecond,
					"the Write does not spin for the advertisement")
				require.Empty(t, q.posted(), "the Write posted before the advertisement came")
				advertOnFake(t, c, 0, addr, rkey, 0, placeMinRead/flowctl.PlaceUnit)
			}
			require.Eventually(t, func() bool { return len(q.posted()) > 0 }, 10*time.Second, time.Millisecond)
			first := q.posted()[0]
			m, err := flowctl.DecodeImm(first.Imm, first.SGL[0].Length)
			require.NoError(t, err)
			if expect {
				require.Equal(t, flowctl.KindPlace, m.Kind, "the Write placed")
				require.Equal(t, uint64(addr), first.RemoteAddr)
			} else {
				require.Equal(t, flowctl.KindData, m.Kind, "the Write went to the ring")
			}
		})
	}
}

// TestPlaceAwaitAdvertMisses: a large Write's wait for the next advertisement stops
// expecting them only after placeMissesMax waits in a row end without one (one late
// advertisement would send every later Write to the ring); a placement starts the
// count afresh.
func TestPlaceAwaitAdvertMisses(t *testing.T) {
	const addr, rkey = 0xbeef0000, 0x51
	c, _ := resizingConn(t)
	expecting := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.place.expect
	}
	c.mu.Lock()
	c.place.reg, c.place.expect = &fakeRegistrar{}, true
	c.mu.Unlock()
	for i := 1; i <= placeMissesMax; i++ {
		c.awaitAdvert(placeMinRead) // the fake peer never advertises: the wait spins out
		require.Equal(t, i < placeMissesMax, expecting(), "after %d waits without an advertisement", i)
	}
	advertOnFake(t, c, 0, addr, rkey, 0, 1)
	require.True(t, expecting(), "an advertisement brings the expectation back")
	_, err := c.Write(streamBytes(9, 6<<10)) // places its first 4 KiB
	require.NoError(t, err)
	require.EqualValues(t, 1, placeStats(c).PlacedSent)
	for range placeMissesMax - 1 {
		c.awaitAdvert(placeMinRead)
	}
	require.True(t, expecting(), "the misses before the placement still counted")
}

// TestPlaceDeclineBackoff: after declines in a row a reader lets 0, 1, 3 … 63
// eligible Reads pass before it advertises again: the first decline, usually a
// writer that was a moment ahead, costs nothing; a writer that never places costs
// an advertisement per 64 Reads. A placement ends the run.
func TestPlaceDeclineBackoff(t *testing.T) {
	c, _ := resizingConn(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	answer := func(op flowctl.PlaceOp, n int) int {
		require.NoError(t, c.onPlaceLocked(flowctl.Arrival{Kind: flowctl.KindPlace, Op: op, Piece: flowctl.Piece{Len: n}}))
		return c.place.skip
	}
	var skips []int
	for range 9 {
		skips = append(skips, answer(flowctl.PlaceDecline, 0))
	}
	require.Equal(t, []int{0, 1, 3, 7, 15, 31, 63, 63, 63}, skips)
	require.Zero(t, answer(flowctl.PlacePlaced, flowctl.PlaceUnit))
	require.Zero(t, answer(flowctl.PlaceDecline, 0), "the first decline after a placement")
	require.Equal(t, 1, answer(flowctl.PlaceDecline, 0))
}

// TestPlaceSpinScale: a wait on a placement spins longer the more bytes it waits to
// see copied, within bounds.
func TestPlaceSpinScale(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, 1}, {placeMinRead, 1}, {placeSpinUnit, 1}, {3 * placeSpinUnit, 3}, {1 << 20, 8},
		{placeSpinScaleMax * placeSpinUnit, placeSpinScaleMax}, {1 << 30, placeSpinScaleMax},
	} {
		require.Equal(t, tc.want, placeSpinScale(tc.n), "placeSpinScale(%d)", tc.n)
	}
}

// TestPlaceStaleRead: ring data that arrives while a Read's buffer is advertised is
// read as usual (the peer no longer places into the buffer), and the Read lets go of
// the advertisement before it returns.
func TestPlaceStaleRead(t *testing.T) {
	f := soft.New(soft.Options{})
	w, r := connPair(t, f, Options{})
	type result struct {
		n   int
		err error
	}
	done := make(chan result)
	buf := make([]byte, placeMinRead)
	go func() {
		n, err := r.Read(buf)
		done <- result{n, err}
	}()
	require.True(t, placeable(w), "no advertisement")
	small := streamBytes(9, 100)
	n, err := w.ReadFrom(bytes.NewReader(small)) // ReadFrom writes to the ring
	require.NoError(t, err)
	require.EqualValues(t, len(small), n)
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, small, buf[:res.n], "the ring's bytes")
	r.mu.Lock()
	held := r.place.mr != nil
	r.mu.Unlock()
	require.False(t, held, "the Read's advertisement held after it returned")
	require.Zero(t, placeStats(r).PlacedReceived)
	require.NoError(t, w.Close())
	require.NoError(t, r.Close())
	requireReleased(t, f)
}

// TestPlaceCancelUnansweredOnFake: a peer that does not answer the withdrawal of an
// advertisement within placeCancelTimeout fails the connection (its QP goes to ERROR,
// so nothing more lands), and the Read lets go of its buffer.
func TestPlaceCancelUnansweredOnFake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &fakeQP{}
		c := newFakeConn(t, q)
		reg := &fakeRegistrar{}
		mr, err := reg.RegMemory(make([]byte, placeMinRead), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		require.NoError(t, err)
		c.mu.Lock()
		c.place.reg = reg
		_, err = c.fc.Advertise(placeMinRead)
		require.NoError(t, err)
		m, ok := c.fc.NextControl() // handed out, as postControlLocked would
		require.True(t, ok)
		require.Equal(t, flowctl.KindPlace, m.Kind)
		c.place.mr = mr
		c.mu.Unlock()

		c.poll = newFakePoller(newFakeCQ(), 64, 0)
		parked := make(chan int32, 1)
		go func() {
			synctest.Wait() // the Read waits for the answer
			parked <- c.poll.parked.Load()
		}()
		start := time.Now()
		require.Zero(t, c.readPlaced())
		require.Equal(t, placeCancelTimeout, time.Since(start), "waited for the answer")
		require.Equal(t, int32(1), <-parked, "counted parked while it waited (nudge.go)")
		require.Zero(t, c.poll.parked.Load(), "counted parked after")
		require.ErrorIs(t, connErr(c), ErrProtocol)
		require.ErrorContains(t, connErr(c), "did not answer")
		require.Equal(t, 1, q.toErrors(), "QP to ERROR")
		wrs := q.posted()
		require.Equal(t, flowctl.PlaceCancel, placeOp(t, wrs[len(wrs)-1].Imm, 0), "the cancel was sent")
		c.mu.Lock()
		held := c.place.mr != nil
		c.mu.Unlock()
		require.False(t, held, "the Read's buffer still advertised")
	})
}
