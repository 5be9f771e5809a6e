package shm

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// The bound of a two-copy stream through shared memory, next to a Unix socket.
//
// BenchmarkBoundRing moves 64 KiB writes from one locked OS thread to another through
// a ring in a shared memfd mapping, with exactly two copies (writer: its buffer into
// the ring; reader: the ring into its buffer) and nothing else: no records, no
// completions, a cursor each way in its own cache line. It is the most any shm stream
// of 64 KiB writes can do on this CPU with a ring of that size, since the engine
// copies at least as much. BenchmarkBoundUnix is the same stream over a Unix socket,
// the figure rsockperf compares RsockSHM with. BenchmarkBoundRing also reports the
// median time of one writer copy and one reader copy (ns/wcopy, ns/rcopy): what the
// cache costs each side, which, unlike throughput, holds on a host whose other tasks
// take turns on the cores. Run them side by side:
//
//	go test -run '^$' -bench 'Bound' -benchtime 2000x ./verbs/shm/
const boundWrite = 64 << 10

func BenchmarkBoundRing(b *testing.B) {
	for _, ring := range []int{128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("ring=%dKiB", ring>>10), func(b *testing.B) { benchRing(b, ring) })
	}
}

// benchRing streams b.N writes of boundWrite bytes through a ring of ringSize bytes.
func benchRing(b *testing.B, ringSize int) {
	fd, mem, err := newSharedMemory(page+ringSize, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer closeFD(fd)
	defer unmap(mem, nil)
	prod := (*atomic.Uint64)(unsafe.Pointer(&mem[0]))
	cons := (*atomic.Uint64)(unsafe.Pointer(&mem[64]))
	ring := mem[page : page+ringSize]
	src := make([]byte, boundWrite)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, boundWrite)
	n := uint64(b.N)
	wcopy := make([]time.Duration, b.N)
	rcopy := make([]time.Duration, b.N)
	done := make(chan struct{})
	b.SetBytes(boundWrite)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { // the writer
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var p uint64
		for i := uint64(0); i < n; i++ {
			for p+boundWrite-cons.Load() > uint64(ringSize) {
				yieldCPU()
			}
			t := time.Now()
			copyRing(ring, p, src, true)
			wcopy[i] = time.Since(t)
			p += boundWrite
			prod.Store(p)
		}
	}()
	runtime.LockOSThread()
	var c uint64
	for i := uint64(0); i < n; i++ {
		for prod.Load() == c {
			yieldCPU()
		}
		t := time.Now()
		copyRing(ring, c, dst, false)
		rcopy[i] = time.Since(t)
		c += boundWrite
		cons.Store(c)
	}
	runtime.UnlockOSThread()
	<-done
	b.StopTimer()
	b.ReportMetric(float64(median(wcopy)), "ns/wcopy")
	b.ReportMetric(float64(median(rcopy)), "ns/rcopy")
	if dst[boundWrite-1] != src[boundWrite-1] {
		b.Fatalf("read %d, wrote %d", dst[boundWrite-1], src[boundWrite-1])
	}
}

// median returns the median of d, which it sorts.
func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// copyRing copies buf into the ring at cursor at (in), or the ring at cursor at into
// buf, wrapping around the ring's end.
func copyRing(ring []byte, at uint64, buf []byte, in bool) {
	off := int(at % uint64(len(ring)))
	k := min(len(buf), len(ring)-off)
	if in {
		copy(ring[off:], buf[:k])
		copy(ring, buf[k:])
	} else {
		copy(buf[:k], ring[off:])
		copy(buf[k:], ring)
	}
}

func BenchmarkBoundUnix(b *testing.B) {
	path := filepath.Join(b.TempDir(), "s")
	l, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	w, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	r, ok := <-accepted
	if !ok {
		b.Fatal("accept failed")
	}
	defer r.Close()
	src := make([]byte, boundWrite)
	dst := make([]byte, boundWrite)
	n := b.N
	done := make(chan error, 1)
	b.SetBytes(boundWrite)
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for range n {
			if _, err := w.Write(src); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range n {
		if _, err := io.ReadFull(r, dst); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
