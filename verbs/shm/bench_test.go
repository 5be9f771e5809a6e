package shm

import (
	"fmt"
	"testing"

	"github.com/rsockio/rsock/verbs"
)

// BenchmarkWriteWithImm: one RDMA WRITE_WITH_IMM at a time between two devices of this
// process, through their sockets, as between two processes: post, then poll the
// sender's and the receiver's completions and post the receive again.
func BenchmarkWriteWithImm(b *testing.B) {
	for _, size := range []int{64, 64 << 10} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			p, err := New(Options{Devices: 2})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			x := newEnd(b, p, "shm0", size)
			y := newEnd(b, p, "shm1", size)
			connectEnds(b, x, y, 14, 7)
			wr := []verbs.SendWR{writeImm(1, x.mr, y.mr, 0, size)}
			recv := []verbs.RecvWR{{ID: 1}}
			if err := y.qp.PostRecv(recv); err != nil {
				b.Fatal(err)
			}
			var wc [2]verbs.WorkCompletion
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if err := x.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < 2; {
					n, err := x.cq.Poll(wc[:])
					if err != nil {
						b.Fatal(err)
					}
					k, err := y.cq.Poll(wc[n:])
					if err != nil {
						b.Fatal(err)
					}
					got += n + k
					if k > 0 {
						if err := y.qp.PostRecv(recv); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
		})
	}
}
