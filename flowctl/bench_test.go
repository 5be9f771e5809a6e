package flowctl

import (
	"fmt"
	"testing"
)

// streamStep moves one write of n bytes from a to b the way the engine does: reserve,
// arrive, read, and hand every due control message back the other way. It reports how
// many bytes were written.
func streamStep(a, b *Endpoint, n int) (int, error) {
	r, err := a.ReserveData(n)
	if err != nil {
		return 0, err
	}
	for _, m := range r.Msgs[:r.Count] {
		if _, err := b.OnArrival(uint32(m.Len), m.Imm); err != nil {
			return 0, err
		}
	}
	first, second := b.Unread()
	if err := b.Consume(first.Len + second.Len); err != nil {
		return 0, err
	}
	for _, pair := range [2][2]*Endpoint{{b, a}, {a, b}} {
		for {
			m, ok := pair[0].NextControl()
			if !ok {
				break
			}
			if _, err := pair[1].OnArrival(0, m.Imm); err != nil {
				return 0, err
			}
		}
	}
	return r.Bytes, nil
}

var benchParams = Params{RingSize: 128 << 10, RecvWQEs: 256}

// TestHotPathAllocatesNothing: writing, arriving, reading and returning credit allocate
// nothing, at any write size.
func TestHotPathAllocatesNothing(t *testing.T) {
	for _, size := range []int{1, 64, 4096, 64 << 10, 1 << 20} {
		a, _ := NewEndpoint(benchParams, benchParams)
		b, _ := NewEndpoint(benchParams, benchParams)
		allocs := testing.AllocsPerRun(1000, func() {
			if n, err := streamStep(a, b, size); n == 0 || err != nil {
				t.Fatalf("streamStep(%d) = %d, %v", size, n, err)
			}
		})
		if allocs != 0 {
			t.Errorf("streamStep(%d) allocates %.1f times per write, want 0", size, allocs)
		}
	}
}

// BenchmarkStream measures the flow-control cost of a steady one-way stream, per write.
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{64, 1024, 16 << 10} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			tx, _ := NewEndpoint(benchParams, benchParams)
			rx, _ := NewEndpoint(benchParams, benchParams)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if n, err := streamStep(tx, rx, size); n != size || err != nil {
					b.Fatalf("streamStep(%d) = %d, %v", size, n, err)
				}
			}
		})
	}
}

func BenchmarkDecodeImm(b *testing.B) {
	b.ReportAllocs()
	v := imm(KindData, 3, 4096)
	for b.Loop() {
		if _, err := DecodeImm(v, 100); err != nil {
			b.Fatal(err)
		}
	}
}
