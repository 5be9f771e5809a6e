package rdma

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
)

// fakeRegistrar is a verbs.MemoryRegistrar for fake Conns: it hands out regions at
// made-up addresses and counts registrations and deregistrations.
type fakeRegistrar struct {
	mu           sync.Mutex
	regs, deregs int
	fail         error
	next         uint64
}

type fakeUserMR struct {
	r    *fakeRegistrar
	buf  []byte
	addr uint64
	key  uint32
}

func (r *fakeRegistrar) RegMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return nil, r.fail
	}
	r.regs++
	r.next += 1 << 32
	return &fakeUserMR{r: r, buf: buf, addr: r.next, key: uint32(100 + r.regs)}, nil
}

func (r *fakeRegistrar) counts() (regs, deregs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.regs, r.deregs
}

func (m *fakeUserMR) Bytes() []byte             { return m.buf }
func (m *fakeUserMR) Addr() uint64              { return m.addr }
func (m *fakeUserMR) LKey() uint32              { return m.key }
func (m *fakeUserMR) RKey() uint32              { return m.key }
func (m *fakeUserMR) Access() verbs.AccessFlags { return verbs.AccessLocalWrite }
func (m *fakeUserMR) Close() error {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	m.r.deregs++
	return nil
}

// directFakeConn is a fake Conn whose provider can register caller memory, with direct
// writes from thr bytes on.
func directFakeConn(t *testing.T, q *fakeQP, thr int) (*Conn, *fakeRegistrar) {
	c := newFakeConn(t, q)
	r := &fakeRegistrar{}
	c.direct.looked, c.direct.reg, c.direct.minLen = true, r, thr
	return c, r
}

// completeAll hands c a successful completion for every signaled send posted so far
// that has not completed, as the device would, and reports how many it handed.
func completeAll(c *Conn, q *fakeQP) int {
	n := 0
	for i, wr := range q.posted() {
		c.mu.Lock()
		done := uint64(i) < c.sqDone
		c.mu.Unlock()
		if !done && wr.Flags&verbs.SendSignaled != 0 {
			c.onCompletion(sendDone(wr.ID))
			n++
		}
	}
	return n
}

// sendCompleter plays the device for a fake Conn until stop: it completes signaled sends as
// they are posted.
func sendCompleter(t *testing.T, c *Conn, q *fakeQP) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
			}
			if completeAll(c, q) == 0 {
				time.Sleep(50 * time.Microsecond) // paces a poll for sends that must come
			}
		}
	}()
	return func() { close(quit); <-done }
}

// TestWriteDirectChoosesPath checks which Writes are posted from the caller's buffer:
// those of at least the threshold, on a provider that registers caller memory, and
// none other; and that what each WR names is the caller's bytes, in order, into the
// peer's ring.
func TestWriteDirectChoosesPath(t *testing.T) {
	const thr = 4 << 10
	for _, tc := range []struct {
		name   string
		size   int
		reg    bool // the provider registers caller memory
		direct bool
	}{
		{"below threshold", thr - 1, true, false},
		{"at threshold", thr, true, true},
		{"above threshold", thr + 1, true, true},
		{"large, split by credit", 3 * fakeRing / 2, true, true},
		{"no capability", 2 * thr, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &fakeQP{}
			c, r := directFakeConn(t, q, thr)
			if !tc.reg {
				c.direct.reg = nil
			}
			stop := sendCompleter(t, c, q)
			p := make([]byte, tc.size)
			for i := range p {
				p[i] = byte(i * 7)
			}
			// The peer's ring holds fakeRing bytes: consume what arrives so that a
			// larger write gets credit back.
			done := make(chan error, 1)
			if tc.size > fakeRing {
				go func() { done <- creditBack(c, tc.size) }()
			} else {
				done <- nil
			}
			n, err := c.Write(p)
			require.NoError(t, err)
			require.Equal(t, tc.size, n)
			require.NoError(t, <-done)
			stop()

			regs, _ := r.counts()
			var got []byte
			for _, wr := range q.posted() {
				dec, err := flowctl.DecodeImm(wr.Imm, sglLen(wr))
				require.NoError(t, err)
				if dec.Kind != flowctl.KindData {
					continue
				}
				s := wr.SGL[0]
				if tc.direct {
					require.NotEqual(t, uint32(fakeStageKey), s.LKey, "WR %d posted from staging", wr.ID)
					c.mu.Lock()
					mr := c.direct.entries[0].mr.(*fakeUserMR)
					c.mu.Unlock()
					got = append(got, mr.buf[s.Addr-mr.addr:][:s.Length]...)
				} else {
					require.Equal(t, uint32(fakeStageKey), s.LKey, "WR %d not posted from staging", wr.ID)
					got = append(got, staged(c, s)...)
				}
			}
			if tc.direct {
				require.Equal(t, 1, regs, "registrations for one %d-byte Write", tc.size)
				require.Equal(t, p, got, "the WRs carry the Write's bytes in order")
				c.mu.Lock()
				require.GreaterOrEqual(t, c.sqDone, c.direct.until, "Write returned before its WRs completed")
				c.mu.Unlock()
			} else {
				require.Zero(t, regs)
			}
		})
	}
}

// creditBack plays the peer's reader for a fake Conn: it returns ring credit for the
// data the Conn posts, as credit updates arriving, until total bytes were posted.
func creditBack(c *Conn, total int) error {
	// The peer's flow control, mirroring c's.
	params := flowctl.Params{RingSize: fakeRing, RecvWQEs: fakeWQEs}
	peer, err := flowctl.NewEndpoint(params, params)
	if err != nil {
		return err
	}
	q := c.qp.(*fakeQP)
	seen, got := 0, 0
	for deadline := time.Now().Add(10 * time.Second); got < total; {
		if time.Now().After(deadline) {
			return fmt.Errorf("peer got %d of %d bytes", got, total)
		}
		wrs := q.posted()
		for _, wr := range wrs[seen:] {
			a, err := peer.OnArrival(sglLen(wr), wr.Imm)
			if err != nil {
				return err
			}
			got += a.Len
			if err := peer.Consume(a.Len); err != nil {
				return err
			}
		}
		seen = len(wrs)
		m, ok := peer.NextControl()
		if !ok {
			m, ok = peer.CreditNow()
		}
		if ok {
			c.mu.Lock()
			_, err := c.fc.OnArrival(0, m.Imm)
			if c.writeParked {
				signal(c.writable)
			}
			c.mu.Unlock()
			if err != nil {
				return err
			}
		}
		time.Sleep(50 * time.Microsecond) // paces a poll for WRs that must come
	}
	return nil
}

func sglLen(wr verbs.SendWR) uint32 {
	if len(wr.SGL) == 0 {
		return 0
	}
	return wr.SGL[0].Length
}

// TestWriteDirectCache checks the registration cache: a buffer written again, or a
// part of it, is registered once; a fifth buffer replaces the least recently used;
// teardown deregisters all; and a registration that fails turns direct writes off.
func TestWriteDirectCache(t *testing.T) {
	const thr = 1 << 10
	q := &fakeQP{}
	c, r := directFakeConn(t, q, thr)
	stop := sendCompleter(t, c, q)
	defer stop()
	bufs := make([][]byte, directCacheSize+1)
	for i := range bufs {
		bufs[i] = make([]byte, 4*thr)
	}
	write := func(p []byte) {
		t.Helper()
		n, err := c.Write(p)
		require.NoError(t, err)
		require.Equal(t, len(p), n)
	}
	// All the writes below fit in the peer's ring: no credit needs to come back.
	for _, b := range bufs[:directCacheSize] {
		write(b)
	}
	write(bufs[0][thr:])   // a part of a registered buffer
	write(bufs[1][:2*thr]) // another
	regs, deregs := r.counts()
	require.Equal(t, directCacheSize, regs, "registrations after re-writing parts of cached buffers")
	require.Zero(t, deregs)

	write(bufs[directCacheSize]) // replaces bufs[2], the least recently used
	write(bufs[0])
	regs, deregs = r.counts()
	require.Equal(t, directCacheSize+1, regs)
	require.Equal(t, 1, deregs)
	write(bufs[2])
	regs, deregs = r.counts()
	require.Equal(t, directCacheSize+2, regs, "bufs[2] was the one replaced")
	require.Equal(t, 2, deregs)

	// A buffer the provider refuses is staged; the next is registered.
	r.mu.Lock()
	r.fail = fmt.Errorf("too large: %w", verbs.ErrInvalidArgument)
	r.mu.Unlock()
	regs, _ = r.counts()
	write(make([]byte, 2*thr))
	require.Equal(t, uint32(fakeStageKey), q.posted()[len(q.posted())-1].SGL[0].LKey, "a refused buffer is staged")
	r.mu.Lock()
	r.fail = nil
	r.mu.Unlock()
	write(make([]byte, 2*thr))
	regs2, _ := r.counts()
	require.Equal(t, regs+1, regs2, "direct writes go on after a refused buffer")

	c.mu.Lock()
	require.NoError(t, c.releaseDirectLocked())
	c.mu.Unlock()
	regs, deregs = r.counts()
	require.Equal(t, regs, deregs, "teardown deregisters every cached buffer")

	// A failed registration: the Write is staged, and so are later ones.
	q2 := &fakeQP{}
	c2, r2 := directFakeConn(t, q2, thr)
	r2.fail = errors.New("out of MRs")
	stop2 := sendCompleter(t, c2, q2)
	defer stop2()
	_, err := c2.Write(make([]byte, 2*thr))
	require.NoError(t, err)
	require.Equal(t, uint32(fakeStageKey), q2.posted()[0].SGL[0].LKey, "staged after a failed registration")
	c2.mu.Lock()
	require.Nil(t, c2.direct.reg, "direct writes off after a failed registration")
	c2.mu.Unlock()
}

// directRegistered reports how many buffers c has registered for direct writes.
func directRegistered(c *Conn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.direct.entries {
		if e.mr != nil {
			n++
		}
	}
	return n
}

// TestWriteDirectStream streams writes of sizes around the threshold, alone and
// interleaved with small ones, from a few reused buffers rewritten between Writes, on
// soft, with rings small enough that large writes wait for credit and wrap, and checks
// every byte the reader gets, read in pieces of random sizes.
func TestWriteDirectStream(t *testing.T) {
	for _, tc := range directStreamCases {
		t.Run(tc.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			directStream(t, f, tc)
			requireReleased(t, f)
		})
	}
}

// TestWriteDirectStreamOverSHM is TestWriteDirectStream on shm, whose direct writes
// register the caller's memory for local access only (verbs.LocalMemoryRegistrar) and
// complete once the peer's goroutine acknowledged them.
func TestWriteDirectStreamOverSHM(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	for _, tc := range directStreamCases {
		t.Run(tc.name, func(t *testing.T) { directStream(t, p, tc) })
	}
}

// directStreamCase is one stream of directStream: the sizes its Writes take in turn.
type directStreamCase struct {
	name  string
	sizes []int
	opts  Options
}

// directStreamThreshold is directStream's smallest direct Write.
const directStreamThreshold = 8 << 10

var directStreamCases = []directStreamCase{
	{"around threshold", []int{directStreamThreshold - 1, directStreamThreshold, directStreamThreshold + 1}, Options{RingSize: 16 << 10, GrowRingTo: -1}},
	{"large", []int{256 << 10, 1 << 20}, Options{RingSize: 16 << 10, GrowRingTo: -1}},
	{"interleaved small and large", []int{1, 100, directStreamThreshold - 1, 3 * directStreamThreshold, 200 << 10}, Options{}},
	{"no spill", []int{7, 64 << 10, directStreamThreshold + 13}, Options{RingSize: 8 << 10, GrowRingTo: -1, ReadBufferSize: -1}},
}

// directStream runs tc on a pair of p's: see TestWriteDirectStream. It checks that
// some Write went direct, and closes both ends.
func directStream(t *testing.T, p verbs.Provider, tc directStreamCase) {
	const thr = directStreamThreshold
	total := 8 << 20
	if raceEnabled || testing.Short() {
		total = 2 << 20
	}
	a, b := connPair(t, p, tc.opts)
	a.direct.minLen = thr // before any Write
	rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
	want := make([]byte, 0, total)
	var bufs [3][]byte
	for i := range bufs {
		bufs[i] = make([]byte, 1<<20)
	}
	var sent []byte
	for len(want) < total {
		buf := bufs[rng.IntN(len(bufs))][rng.IntN(64):] // unaligned starts too
		n := tc.sizes[rng.IntN(len(tc.sizes))]
		n = min(n, len(buf))
		for i := range buf[:n] {
			buf[i] = byte(rng.Uint32())
		}
		want = append(want, buf[:n]...)
		sent = append(sent, 0) // marks one Write
	}
	got := make(chan []byte, 1)
	go func() {
		var all []byte
		p := make([]byte, 300<<10)
		r := rand.New(rand.NewPCG(2, 2))
		for {
			n, err := b.Read(p[:1+r.IntN(len(p)-1)])
			all = append(all, p[:n]...)
			if err != nil {
				got <- all
				return
			}
		}
	}()
	// Replay the same sequence of Writes.
	rng = rand.New(rand.NewPCG(1, uint64(len(tc.name))))
	off := 0
	for range sent {
		buf := bufs[rng.IntN(len(bufs))][rng.IntN(64):]
		n := min(tc.sizes[rng.IntN(len(tc.sizes))], len(buf))
		for i := range buf[:n] {
			buf[i] = byte(rng.Uint32())
		}
		require.Equal(t, want[off:off+n], buf[:n])
		k, err := a.Write(buf[:n])
		require.NoError(t, err)
		require.Equal(t, n, k)
		off += n
	}
	require.NotZero(t, directRegistered(a), "no Write went direct")
	require.NoError(t, a.Close())
	all := <-got
	require.Equal(t, len(want), len(all), "bytes read")
	require.True(t, bytes.Equal(want, all), "the stream read differs from the one written")
	require.NoError(t, b.Close())
}

// TestWriteDirectCompletesBeforeReturn checks that a direct Write returns only once the
// device has read the buffer: with the writer's QP delaying every send, the test
// overwrites the buffer as soon as Write returns, and the reader must still get what
// was written. Had Write returned at posting, the delayed sends would carry the new
// bytes.
func TestWriteDirectCompletesBeforeReturn(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	a.direct.minLen = 1 << 10
	buf := streamBytes(3, 64<<10)
	want := bytes.Clone(buf)
	require.NoError(t, f.DelayQP(a.ep.qp, 20*time.Millisecond))
	n, err := a.Write(buf)
	require.NoError(t, err)
	require.Equal(t, len(buf), n)
	require.Equal(t, 1, directRegistered(a), "the Write was direct")
	require.Zero(t, a.poll.parked.Load(), "a wait for the device counted parked after it (nudge.go)")
	clear(buf)
	got := make([]byte, len(want))
	_, err = io.ReadFull(b, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the reader got bytes written after Write returned")
	require.NoError(t, f.DelayQP(a.ep.qp, 0))
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestWriteDirectCompletesBeforeReturnOverSHM is TestWriteDirectCompletesBeforeReturn
// on shm, where the requester copies the payload as it posts: its QP loses every
// request until repaired, so the Write's request is sent again at the ACK timeout,
// copied from the application's buffer once more. The Write returns only after that,
// and the reader gets the bytes of the buffer as written.
func TestWriteDirectCompletesBeforeReturnOverSHM(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	a, b := connPair(t, p, Options{})
	a.direct.minLen = 1 << 10
	buf := streamBytes(3, 64<<10)
	want := bytes.Clone(buf)
	require.NoError(t, p.BreakQP(a.ep.qp))
	a.mu.Lock()
	before := a.sqPosted
	a.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := a.Write(buf)
		done <- err
	}()
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.sqPosted > before
	}, 10*time.Second, time.Millisecond, "the Write posted nothing")
	require.Empty(t, done, "the Write returned while its request was lost")
	require.NoError(t, p.RepairQP(a.ep.qp))
	require.NoError(t, <-done)
	require.Equal(t, 1, directRegistered(a), "the Write was direct")
	clear(buf)
	got := make([]byte, len(want))
	_, err = io.ReadFull(b, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the reader got bytes written after Write returned")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

// TestWriteDirectInterrupted stops a direct Write mid-transfer, blocked on credit from
// a peer that does not read: by its deadline, by Close, and by the peer's QP failing.
// The Write reports the bytes it posted, and the reader gets exactly those (then more,
// after a deadline; io.EOF after Close), never a byte of the buffer beyond them.
func TestWriteDirectInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		interrupt func(t *testing.T, f *soft.Fabric, a, b *Conn)
		wantErr   []error // one of
	}{
		{"deadline", func(t *testing.T, f *soft.Fabric, a, b *Conn) {
			require.NoError(t, a.SetWriteDeadline(time.Unix(1, 0)))
		}, []error{os.ErrDeadlineExceeded}},
		{"close", func(t *testing.T, f *soft.Fabric, a, b *Conn) {
			require.NoError(t, a.Close())
		}, []error{net.ErrClosed}},
		{"peer fails", func(t *testing.T, f *soft.Fabric, a, b *Conn) {
			require.NoError(t, f.BreakQP(b.ep.qp))
			b.mu.Lock()
			b.failLocked(errors.New("test: peer failed")) // and its engine says so: credit stops for good
			b.mu.Unlock()
		}, []error{ErrQPFailed, ErrPeerClosed}}, // whichever it learns first
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			a, b := connPair(t, f, Options{RingSize: 16 << 10, GrowRingTo: -1, ReadBufferSize: -1})
			a.direct.minLen = 1 << 10
			buf := streamBytes(4, 1<<20)
			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := a.Write(buf)
				done <- result{n, err}
			}()
			// Wait until the Write has filled the peer's ring and parked for credit.
			require.Eventually(t, func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				return a.writeParked && a.fc.Writable() == 0 && a.poll.parked.Load() == 1 // counted: nudge.go
			}, 10*time.Second, time.Millisecond)
			tc.interrupt(t, f, a, b)
			r := <-done
			require.Zero(t, a.poll.parked.Load(), "counted parked after the Write returned")
			require.True(t, slices.ContainsFunc(tc.wantErr, func(e error) bool { return errors.Is(r.err, e) }),
				"Write's error %v is none of %v", r.err, tc.wantErr)
			require.Positive(t, r.n)
			require.Less(t, r.n, len(buf))
			a.mu.Lock()
			require.GreaterOrEqual(t, a.sqDone, a.direct.until, "Write returned before its WRs completed")
			a.mu.Unlock()

			switch tc.name {
			case "deadline":
				// The rest follows, from the same registration; the reader gets it all.
				require.NoError(t, a.SetWriteDeadline(time.Time{}))
				go func() {
					n, err := a.Write(buf[r.n:])
					done <- result{n, err}
				}()
				got := make([]byte, len(buf))
				_, err := io.ReadFull(b, got)
				require.NoError(t, err)
				require.True(t, bytes.Equal(buf, got), "stream after a deadline")
				r2 := <-done
				require.NoError(t, r2.err)
				require.Equal(t, len(buf)-r.n, r2.n)
				require.NoError(t, a.Close())
			case "close":
				got, err := io.ReadAll(b)
				require.NoError(t, err)
				require.Equal(t, r.n, len(got), "bytes the peer read, after a Write that reported %d", r.n)
				require.True(t, bytes.Equal(buf[:r.n], got))
			default:
				// Close reports an error only for bytes Write accepted that the peer's
				// device never acknowledged, and Write waited for those it reported.
				require.NoError(t, a.Close())
			}
			require.NoError(t, b.Close())
			requireReleased(t, f)
		})
	}
}

// BenchmarkWriteDirect compares staged and direct Writes side by side: a one-way
// stream of size-byte Writes, read into a buffer of the same size on the peer's
// goroutine (as rsockperf's stream does), with the default options.
func BenchmarkWriteDirect(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, mode := range []struct {
			name string
			min  int
		}{{"staged", 1 << 62}, {"direct", directMinWrite}} {
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, mode.name), func(b *testing.B) {
				f := soft.New(soft.Options{})
				w, r := connPair(b, f, Options{})
				w.direct.minLen = mode.min
				done := drainReads(r, size)
				benchWrites(b, w, size) // bench_test.go
				w.Close()
				<-done
				r.Close()
			})
		}
	}
}

// TestNetConnDirect runs the net.Conn conformance tests with every Write of 1 byte or
// more direct: deadlines, Close and concurrent methods meet direct writes.
func TestNetConnDirect(t *testing.T) {
	f := soft.New(soft.Options{})
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b := connPair(t, f, Options{RingSize: 16 << 10, SendBufferSize: 8 << 10})
		a.direct.minLen, b.direct.minLen = 1, 1
		return a, b, func() { a.Close(); b.Close() }, nil
	})
	// As in TestNetConn: nettest's own copying goroutine may still be in a Read that
	// releases its Conn's endpoint as it returns, just after the last case.
	require.Eventually(t, func() bool { return f.Stats().QPs == 0 }, 10*time.Second, time.Millisecond,
		"a QP still held after the last case: %+v", f.Stats())
	requireReleased(t, f)
}

// TestNetConnDirectOverSHM is TestNetConnDirect on shm.
func TestNetConnDirectOverSHM(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	var direct atomic.Int64 // buffers registered for direct writes, as each pair closes
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b := connPair(t, p, Options{RingSize: 16 << 10, SendBufferSize: 8 << 10})
		a.direct.minLen, b.direct.minLen = 1, 1
		return a, b, func() {
			direct.Add(int64(directRegistered(a) + directRegistered(b)))
			a.Close()
			b.Close()
		}, nil
	})
	require.Positive(t, direct.Load(), "no Write went direct")
}

// TestWriteDirectIdleRelease checks that a cached buffer no Write used for a whole
// keepalive period is deregistered at the next tick, that one in use is kept, and that
// no tick touches the cache while a direct Write holds it.
func TestWriteDirectIdleRelease(t *testing.T) {
	const thr = 1 << 10
	q := &fakeQP{}
	c, r := directFakeConn(t, q, thr)
	stop := sendCompleter(t, c, q)
	defer stop()
	old, hot := make([]byte, 2*thr), make([]byte, 2*thr)
	write := func(p []byte) {
		t.Helper()
		_, err := c.Write(p)
		require.NoError(t, err)
	}
	tick := func() {
		c.mu.Lock()
		c.idleDirectLocked()
		c.mu.Unlock()
	}
	write(old)
	write(hot)
	tick() // both used since the last tick: kept
	require.Equal(t, 2, directRegistered(c))
	write(hot)
	tick() // old idle for a period: released
	require.Equal(t, 1, directRegistered(c))
	_, deregs := r.counts()
	require.Equal(t, 1, deregs)

	c.mu.Lock()
	c.direct.writing = true // as between a Write's lookup and its completions
	c.idleDirectLocked()
	c.idleDirectLocked()
	c.direct.writing = false
	c.mu.Unlock()
	require.Equal(t, 1, directRegistered(c), "a tick during a direct Write released its buffer")
	tick()
	tick()
	require.Zero(t, directRegistered(c), "an idle buffer outlived two ticks")
	write(old)
	regs, _ := r.counts()
	require.Equal(t, 3, regs, "a released buffer written again is registered again")
}

// TestWriteDirectWaitsOutCloseFailure checks that a direct Write in flight does not
// return on a failure during Close, which leaves the QP to teardown rather than moving
// it to ERROR (failLocked): until then the device may still read the buffer, which the
// application may reuse once Write returns. It returns at teardown.
func TestWriteDirectWaitsOutCloseFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &fakeQP{}
		c, _ := directFakeConn(t, q, 1)
		done := make(chan error, 1)
		go func() {
			_, err := c.Write(make([]byte, 4<<10))
			done <- err
		}()
		synctest.Wait()
		require.NotEmpty(t, q.posted(), "the Write posted")
		require.Empty(t, done, "the Write returned before its WRs completed")

		c.mu.Lock()
		c.closing = true
		c.failLocked(errors.New("control channel lost"))
		require.False(t, c.qpErrored, "a failure during Close leaves the QP to teardown")
		c.mu.Unlock()
		synctest.Wait()
		require.Empty(t, done, "the Write returned on a failure while its QP could still read the buffer")

		c.mu.Lock()
		require.NoError(t, c.releaseDirectLocked()) // teardown's part, once the QP is stopped
		c.mu.Unlock()
		require.ErrorIs(t, <-done, net.ErrClosed)
	})
}
