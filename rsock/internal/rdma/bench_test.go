package rdma

import (
	"fmt"
	"io"
	"testing"

	"github.com/rsockio/rsock/verbs/soft"
)

// BenchmarkStream measures one-way throughput through the engine; the reader drains on
// its own goroutine. "fixed" is a fixed 128 KiB ring and 64 KiB staging buffer (the
// defaults before rings grew), "growing" the defaults: rings that start at 8 KiB and
// grow to DefaultGrowRingTo. The second must keep up with the first.
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
		for _, o := range []struct {
			name string
			opts Options
		}{{"fixed", fixedOptions}, {"growing", Options{}}} {
			b.Run(fmt.Sprintf("%dB/%s", size, o.name), func(b *testing.B) { benchStream(b, size, o.opts) })
		}
	}
}

func benchStream(b *testing.B, size int, opts Options) {
	f := soft.New(soft.Options{})
	w, r := connPair(b, f, opts)
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, r)
		close(done)
	}()
	benchWrites(b, w, size)
	w.CloseWrite()
	<-done
	w.Close()
	r.Close()
}

// benchWrites times size-byte Writes on w, b.N of them.
func benchWrites(b *testing.B, w *Conn, size int) {
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamRead is BenchmarkStream with a reader that Reads into a buffer of
// the Write's size, as most applications do, rather than WriteTo: "placed" lets the
// writer place into the Read's buffer where it may (place.go), "ring" copies every
// byte through the ring (Options.NoPlacement). placed/msg is the share of messages
// placed. Where the two cross is placeMinRead.
func BenchmarkStreamRead(b *testing.B) {
	for _, size := range []int{64 << 10, 128 << 10, 1 << 20} {
		for _, o := range []struct {
			name string
			opts Options
		}{{"placed", Options{}}, {"ring", Options{NoPlacement: true}}} {
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, o.name), func(b *testing.B) { benchStreamRead(b, size, o.opts) })
		}
	}
}

func benchStreamRead(b *testing.B, size int, opts Options) {
	f := soft.New(soft.Options{})
	w, r := connPair(b, f, opts)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, size)
		for {
			if _, err := r.Read(buf); err != nil {
				return
			}
		}
	}()
	benchWrites(b, w, size)
	w.CloseWrite()
	<-done
	st := r.Stats()
	b.ReportMetric(float64(st.Placements)/float64(max(st.MessagesReceived, 1)), "placed/msg")
	w.Close()
	r.Close()
}

// BenchmarkPingPong64B measures a 64-byte round trip.
func BenchmarkPingPong64B(b *testing.B) {
	f := soft.New(soft.Options{})
	c1, c2 := connPair(b, f, Options{})
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(c2, buf); err != nil {
				return
			}
			if _, err := c2.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	b.SetBytes(64)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c1.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c1, buf); err != nil {
			b.Fatal(err)
		}
	}
	c1.Close()
	c2.Close()
}

// BenchmarkPingPong64BOneGoroutine is BenchmarkPingPong64B with one goroutine driving
// both ends in turn (write on one, read on the other, and back): the engine's own cost of
// a 64-byte round trip, without the hand-off between two goroutines (or cores) that the
// two-party exchange adds. It is the counterpart of BenchmarkSoftVerbs's
// PingPong64BOneGoroutine in benchmarks/, which rsockperf's SoftVerbs pingpong measures:
// the ratio of the two is what the socket layer adds to raw soft verbs.
func BenchmarkPingPong64BOneGoroutine(b *testing.B) {
	f := soft.New(soft.Options{})
	c1, c2 := connPair(b, f, Options{})
	defer c1.Close()
	defer c2.Close()
	buf := make([]byte, 64)
	b.SetBytes(64)
	b.ReportAllocs()
	for b.Loop() {
		for _, hop := range [2][2]*Conn{{c1, c2}, {c2, c1}} {
			if _, err := hop[0].Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(hop[1], buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}
