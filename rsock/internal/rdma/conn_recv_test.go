package rdma

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// streamBytes returns n bytes of the seeded pseudo-random stream.
func streamBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8(seedBytes(seed)).Read(b)
	return b
}

// spilledBytes reads how many bytes c has moved out of its ring.
func spilledBytes(c *Conn) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spilled
}

// TestWriteWithoutReader: nobody reads, and a Write of the read buffer plus half the
// ring still returns, because the receiving engine spills; the reader then gets every
// byte, in order, and io.EOF.
func TestWriteWithoutReader(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	msg := streamBytes(1, DefaultReadBufferSize+DefaultRingSize/2)
	n, err := a.Write(msg)
	require.NoError(t, err)
	require.Equal(t, len(msg), n)
	require.NoError(t, a.CloseWrite())
	require.Positive(t, spilledBytes(b), "b spilled nothing")

	got, err := io.ReadAll(b)
	require.NoError(t, err)
	require.True(t, bytes.Equal(msg, got), "stream differs: %d bytes read of %d", len(got), len(msg))
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// progress is how far a writer has got, for a reader to wait on without timing.
type progress struct {
	mu      sync.Mutex
	cond    sync.Cond
	written int
	done    bool
}

func newProgress() *progress {
	p := &progress{}
	p.cond.L = &p.mu
	return p
}

func (p *progress) add(n int, done bool) {
	p.mu.Lock()
	p.written += n
	p.done = p.done || done
	p.mu.Unlock()
	p.cond.Broadcast()
}

// waitFor waits until the writer has written n bytes or stopped.
func (p *progress) waitFor(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.written < n && !p.done {
		p.cond.Wait()
	}
}

// TestReaderStopsAndGoes: the reader reads a random amount, then stops until the writer
// is up to a megabyte ahead (the ring and the spill buffer take that much), and so on.
// Spilled and ring bytes interleave in every way; every byte arrives once, in order.
func TestReaderStopsAndGoes(t *testing.T) {
	// 16 MiB is over a hundred stop-and-go rounds for each way of reading; 64 MiB, as
	// this test once moved, was four times the rounds and the time for no new case.
	total := 16 << 20
	for _, useWriteTo := range []bool{false, true} {
		t.Run(map[bool]string{false: "Read", true: "WriteTo"}[useWriteTo], func(t *testing.T) {
			f := soft.New(soft.Options{})
			a, b := connPair(t, f, Options{})
			msg := streamBytes(2, total)
			prog := newProgress()
			go func() {
				rng := rand.New(rand.NewPCG(3, 3))
				n := 0
				for n < total {
					m, err := a.Write(msg[n:min(total, n+1+rng.IntN(256<<10))])
					n += m
					prog.add(m, err != nil)
					if err != nil {
						return
					}
				}
				a.CloseWrite()
			}()

			rng := rand.New(rand.NewPCG(4, 4))
			var got bytes.Buffer
			buf := make([]byte, 256<<10)
			for got.Len() < total {
				prog.waitFor(min(total, got.Len()+DefaultRingSize+rng.IntN(1<<20)))
				want := 1 + rng.IntN(len(buf))
				if useWriteTo {
					// WriteTo until the sink has taken want bytes.
					_, err := b.WriteTo(&limitedSink{buf: &got, left: want})
					if err == nil {
						require.Equal(t, total, got.Len(), "WriteTo ended before the stream did")
						break
					}
					require.ErrorIs(t, err, errSinkFull)
					continue
				}
				n, err := io.ReadFull(b, buf[:min(want, total-got.Len())])
				require.NoError(t, err)
				got.Write(buf[:n])
			}
			n, err := b.Read(buf)
			require.Equal(t, io.EOF, err, "after the stream, %d bytes", n)
			require.True(t, bytes.Equal(msg, got.Bytes()[:total]), "stream differs")
			require.Positive(t, spilledBytes(b), "b spilled nothing")
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
			requireReleased(t, f)
		})
	}
}

var errSinkFull = errors.New("sink full")

// limitedSink takes left bytes, then fails.
type limitedSink struct {
	buf  *bytes.Buffer
	left int
}

func (s *limitedSink) Write(p []byte) (int, error) {
	n := min(len(p), s.left)
	s.buf.Write(p[:n])
	s.left -= n
	if s.left == 0 {
		return n, errSinkFull
	}
	return n, nil
}

// TestSpillWhenReadEnds: while a WriteTo is in progress nothing spills, so a writer
// fills the ring and blocks; when the WriteTo ends, its end spills the ring and the
// writer goes on, although nobody reads any more.
func TestSpillWhenReadEnds(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	msg := streamBytes(5, DefaultRingSize+DefaultReadBufferSize/2)
	pr, pw := io.Pipe()
	stuck := errors.New("stuck sink")
	readDone := make(chan error, 1)
	go func() {
		_, err := b.WriteTo(pw) // blocks in pw.Write: nobody reads pr
		readDone <- err
	}()
	writeDone := make(chan error, 1)
	go func() {
		_, err := a.Write(msg)
		writeDone <- err
	}()
	// Whatever has happened so far, the write cannot finish while WriteTo holds the
	// ring: the ring is smaller than msg and nothing spills. End the WriteTo.
	pr.CloseWithError(stuck)
	require.ErrorIs(t, <-readDone, stuck)
	require.NoError(t, <-writeDone, "the writer did not get past the ring")

	// WriteTo took at most the first piece it wrote to the pipe, which failed: every
	// byte is still to read.
	got, err := io.ReadAll(io.LimitReader(b, int64(len(msg))))
	require.NoError(t, err)
	require.True(t, bytes.Equal(msg, got), "stream differs")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestReadWriteAllocateNothing: steady-state Write and Read allocate nothing, with the
// reader keeping up and with bytes spilled while it is not reading.
func TestReadWriteAllocateNothing(t *testing.T) {
	f := soft.New(soft.Options{})
	// A fixed ring: growing one registers memory, which allocates, until it is grown.
	const ring = 128 << 10
	a, b := connPair(t, f, Options{RingSize: ring, GrowRingTo: -1})
	for _, size := range []int{64, 4 << 10, 64 << 10, ring} {
		// A ring's worth of bytes written before any is read spill.
		wbuf, rbuf := make([]byte, size), make([]byte, size)
		before := spilledBytes(b)
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := a.Write(wbuf); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(b, rbuf); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("Write(%d bytes) then Read: %.1f allocations, want 0", size, allocs)
		}
		if size == ring {
			require.Greater(t, spilledBytes(b), before, "writes of a whole ring did not spill")
		}
	}
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestReadEndSpillsOnlyForBlockedPeer: at the end of a Read that leaves half the ring
// or more buffered, the bytes stay in the ring while the peer still holds ring credit
// (its next arrival would spill them if nobody read). When it holds none it may be
// blocked: what the Read consumed goes back at once in an early credit update, when it
// is an eighth of the ring or more; after less, the end of the Read spills (and returns
// the credit of the spilled bytes).
func TestReadEndSpillsOnlyForBlockedPeer(t *testing.T) {
	const chunk = 8 << 10
	for _, tc := range []struct {
		name        string
		arrive      int // bytes arriving during the Read
		read        int // bytes the Read takes from the ring
		wantSpilled bool
		wantCredit  bool // an early credit update is posted
	}{
		{"peer holds credit", fakeRing - chunk, 1000, false, false},
		{"peer out of credit", fakeRing, fakeRing / 8, false, true},
		{"peer out of credit, little read", fakeRing, 1000, true, true}, // the spilled bytes' credit
		{"peer out of credit, nothing read", fakeRing, 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &fakeQP{}
			c := newFakeConn(t, q)
			c.mu.Lock()
			c.reading = true // a Read in progress: arrivals do not spill
			c.mu.Unlock()
			for off := 0; off < tc.arrive; off += chunk {
				arrive(t, c, uint64(off/chunk), flowctl.KindData, off, string(make([]byte, chunk)))
			}
			require.Zero(t, spilledBytes(c), "spilled under a Read")
			c.consume(0, tc.read, true) // the Read ends
			if got := spilledBytes(c); (got > 0) != tc.wantSpilled {
				t.Errorf("after %d bytes arrived and %d read, %d bytes spilled; want spilled %v", tc.arrive, tc.read, got, tc.wantSpilled)
			}
			credit := false
			for _, wr := range q.posted() {
				m, err := flowctl.DecodeImm(wr.Imm, 0)
				require.NoError(t, err)
				credit = credit || (m.Kind == flowctl.KindCredit && m.RingCredits > 0)
			}
			require.Equal(t, tc.wantCredit, credit, "a credit update posted after %d bytes arrived and %d read", tc.arrive, tc.read)
		})
	}
}

// fed is one completion a receive-path test hands a fake Conn.
type fed struct {
	kind   flowctl.Kind
	data   string
	status verbs.WCStatus // a failed completion when not WCSuccess
	gen    uint64         // a generation other than the Conn's: a stale completion
}

// feed hands c the completions of fs on consecutive receive WQEs from 0, writing each
// data message where flowctl expects it in the ring (the test's arrivals never wrap).
func feed(t *testing.T, c *Conn, fs []fed) {
	t.Helper()
	off := 0
	for i, f := range fs {
		wqe := uint64(i)
		if f.status == verbs.WCSuccess && f.gen == 0 {
			arrive(t, c, wqe, f.kind, off, f.data)
			off += len(f.data)
			continue
		}
		gen := c.gen
		if f.gen != 0 {
			gen = f.gen
		}
		var imm uint32 // an error completion's is undefined
		if f.kind != 0 {
			var err error
			imm, err = flowctl.Imm{Kind: f.kind}.Encode()
			require.NoError(t, err)
		}
		c.onCompletion(&verbs.WorkCompletion{WRID: recvWRFlag | gen | wqe, Status: f.status,
			Opcode: verbs.WCRecvRDMAWithImm, Flags: verbs.WCWithImm, Imm: imm, ByteLen: uint32(len(f.data))})
	}
}

// TestRecvCompletions feeds a fake Conn sequences of receive completions and reads:
// the bytes come out in order, and buffered bytes are read before the end of the
// stream or its failure; every successful receive completion re-posts its WQE (a failed
// one does not: the QP is going down); a stale one is dropped without a trace.
func TestRecvCompletions(t *testing.T) {
	tests := []struct {
		name         string
		feed         []fed
		want         string   // bytes read before the error
		wantErr      error    // what Read returns then; nil: it would wait
		wantConnErr  error    // the Conn's sticky error
		wantReposted []uint64 // WQE indices, in order
		wantStale    uint64
	}{
		{name: "bytes then FIN",
			feed: []fed{{kind: flowctl.KindData, data: "hello, "}, {kind: flowctl.KindData, data: "ring"}, {kind: flowctl.KindFIN}},
			want: "hello, ring", wantErr: io.EOF, wantReposted: []uint64{0, 1, 2}},
		{name: "bytes survive a flush",
			feed: []fed{{kind: flowctl.KindData, data: "kept"}, {status: verbs.WCWRFlushErr}},
			want: "kept", wantErr: ErrQPFailed, wantConnErr: ErrQPFailed, wantReposted: []uint64{0}},
		{name: "bytes survive a remote error",
			feed: []fed{{kind: flowctl.KindData, data: "kept"}, {status: verbs.WCRemAccessErr}},
			want: "kept", wantErr: ErrQPFailed, wantConnErr: ErrQPFailed, wantReposted: []uint64{0}},
		{name: "keepalives carry no bytes",
			feed: []fed{{kind: flowctl.KindKeepalive}, {kind: flowctl.KindData, data: "x"}, {kind: flowctl.KindKeepalive}},
			want: "x", wantReposted: []uint64{0, 1, 2}},
		{name: "stale completions dropped",
			feed: []fed{{kind: flowctl.KindData, data: "old", gen: 7 << genShift}, {kind: flowctl.KindData, data: "new"},
				{status: verbs.WCWRFlushErr, gen: 7 << genShift}},
			want: "new", wantReposted: []uint64{1}, wantStale: 2},
		{name: "data after the FIN",
			// The stream the peer ended is whole: Read reports its end; the Conn failed.
			feed: []fed{{kind: flowctl.KindData, data: "all"}, {kind: flowctl.KindFIN}, {kind: flowctl.KindData, data: "more"}},
			want: "all", wantErr: io.EOF, wantConnErr: ErrProtocol, wantReposted: []uint64{0, 1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &fakeQP{}
			c := newFakeConn(t, q)
			feed(t, c, tt.feed)
			var reposted []uint64
			for _, wr := range q.reposted() {
				reposted = append(reposted, wr.ID&^recvWRFlag)
			}
			require.Equal(t, tt.wantReposted, reposted, "receive WQEs re-posted")
			require.Equal(t, tt.wantStale, c.stale.Load(), "stale completions")
			if tt.wantConnErr == nil {
				require.NoError(t, connErr(c))
			} else {
				require.ErrorIs(t, connErr(c), tt.wantConnErr)
			}
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(buf[:n]))
			if tt.wantErr != nil {
				_, err = c.Read(buf)
				require.ErrorIs(t, err, tt.wantErr, "Read after %q", tt.want)
			}
		})
	}
}

// TestRecvReturnsCredit: the receive path gives credit back as flowctl's thresholds
// say: a standalone update once half the receive WQEs were consumed (each re-posted),
// and once half the ring was read or, with nobody reading and the peer out of ring
// credit, spilled; not for less.
func TestRecvReturnsCredit(t *testing.T) {
	keepalives := func(n int) []fed {
		fs := make([]fed, n)
		for i := range fs {
			fs[i].kind = flowctl.KindKeepalive
		}
		return fs
	}
	data := func(n int) []fed { return []fed{{kind: flowctl.KindData, data: string(make([]byte, n))}} }
	tests := []struct {
		name        string
		feed        []fed
		reading     bool // a Read is in progress during the feed: nothing spills
		read        bool // then read everything
		wantWQE     uint32
		wantRing    bool
		wantSpilled bool
	}{
		{name: "one WQE short of half", feed: keepalives(fakeWQEs/2 - 1)},
		{name: "half the WQEs", feed: keepalives(fakeWQEs / 2), wantWQE: fakeWQEs / 2},
		{name: "a quarter of the ring read", feed: data(fakeRing / 4), read: true},
		{name: "half the ring, nobody reads, the peer holds credit", feed: data(fakeRing / 2)},
		{name: "the whole ring, nobody reads", feed: data(fakeRing), wantWQE: 1, wantRing: true, wantSpilled: true},
		{name: "half the ring during a Read, unread", feed: data(fakeRing / 2), reading: true},
		{name: "half the ring during a Read, read", feed: data(fakeRing / 2), reading: true, read: true,
			wantWQE: 1, wantRing: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &fakeQP{}
			c := newFakeConn(t, q)
			c.reading = tt.reading
			feed(t, c, tt.feed)
			if tt.read {
				_, err := c.Read(make([]byte, fakeRing))
				require.NoError(t, err)
			}
			var wqe uint32
			ring := false
			for _, wr := range q.posted() {
				m, err := flowctl.DecodeImm(wr.Imm, 0)
				require.NoError(t, err)
				require.Equal(t, flowctl.KindCredit, m.Kind, "only credit updates are posted")
				wqe += m.WQECredits
				ring = ring || m.RingCredits > 0
			}
			require.Equal(t, tt.wantWQE, wqe, "WQE credit returned after %d arrivals", len(tt.feed))
			require.Equal(t, tt.wantRing, ring, "ring credit returned")
			require.Equal(t, tt.wantSpilled, spilledBytes(c) > 0, "spilled")
			require.Len(t, q.reposted(), len(tt.feed), "receive WQEs re-posted")
		})
	}
}

// TestReadAcrossRingEnd: bytes that wrap around the end of the ring come out of one
// Read in order, and out of WriteTo.
func TestReadAcrossRingEnd(t *testing.T) {
	for _, useWriteTo := range []bool{false, true} {
		q := &fakeQP{}
		c := newFakeConn(t, q)
		const head = fakeRing - 8
		arrive(t, c, 0, flowctl.KindData, 0, string(make([]byte, head)))
		n, err := io.ReadFull(c, make([]byte, head))
		require.NoError(t, err)
		require.Equal(t, head, n)
		arrive(t, c, 1, flowctl.KindData, head, "01234567")
		arrive(t, c, 2, flowctl.KindData, 0, "89abcdef")
		var got []byte
		if useWriteTo {
			arrive(t, c, 3, flowctl.KindFIN, 0, "")
			var b bytes.Buffer
			_, err = c.WriteTo(&b)
			got = b.Bytes()
		} else {
			buf := make([]byte, 32)
			n, err = c.Read(buf)
			got = buf[:n]
		}
		require.NoError(t, err)
		require.Equal(t, "0123456789abcdef", string(got), "WriteTo %v", useWriteTo)
	}
}

// countWriter is an io.Writer that takes nothing and returns count: a writer that
// breaks io.Writer's contract.
type countWriter struct{ count int }

func (w countWriter) Write(p []byte) (int, error) { return w.count, nil }

// TestWriteToInvalidCount: a writer that reports a count below zero or beyond what it
// was given makes WriteTo fail without consuming a byte, so a later Read still gets
// them all, in order.
func TestWriteToInvalidCount(t *testing.T) {
	for _, tt := range []struct {
		name  string
		count int
	}{
		{"negative", -1},
		{"beyond the slice", len("ring bytes") + 1},
		{"far beyond", 1 << 30},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeConn(t, &fakeQP{})
			arrive(t, c, 0, flowctl.KindData, 0, "ring bytes")
			n, err := c.WriteTo(countWriter{tt.count})
			require.ErrorIs(t, err, errInvalidWrite)
			require.Zero(t, n)
			buf := make([]byte, 64)
			n2, err := c.Read(buf)
			require.NoError(t, err)
			require.Equal(t, "ring bytes", string(buf[:n2]), "bytes consumed by the failed WriteTo")
		})
	}
}
