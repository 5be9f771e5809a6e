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
	total := 64 << 20
	if raceEnabled || testing.Short() {
		total = 16 << 20
	}
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
