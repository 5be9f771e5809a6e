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

// BenchmarkDriveIdle: one pass of a Poll over the rings of 127 QPs that feed its CQ
// with nothing published, as an rsock engine's CQ holds by default (drive.go): what an
// idle connection costs each Poll of a busy one on the same CQ.
func BenchmarkDriveIdle(b *testing.B) {
	const qps = 127
	p, err := New(Options{Devices: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	x := newEnd(b, p, "shm0", 4096)
	y := newEnd(b, p, "shm1", 4096)
	caps := verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	pairs := []*end{x, y}
	for range qps - 1 {
		xq, err := x.pd.CreateQP(verbs.QPInitAttr{SendCQ: x.cq, RecvCQ: x.cq, Caps: caps})
		if err != nil {
			b.Fatal(err)
		}
		yq, err := y.pd.CreateQP(verbs.QPInitAttr{SendCQ: y.cq, RecvCQ: y.cq, Caps: caps})
		if err != nil {
			xq.Close()
			b.Fatal(err)
		}
		b.Cleanup(func() { xq.Close(); yq.Close() })
		pairs = append(pairs, &end{qp: xq, gid: x.gid}, &end{qp: yq, gid: y.gid})
	}
	// Each pair's first write starts its connection: then every QP of y's CQ has a
	// request ring, empty.
	var wc [16]verbs.WorkCompletion
	for i := 0; i < len(pairs); i += 2 {
		connectEnds(b, pairs[i], pairs[i+1], 0, 7)
		if err := pairs[i+1].qp.PostRecv([]verbs.RecvWR{{ID: 1}}); err != nil {
			b.Fatal(err)
		}
		if err := pairs[i].qp.PostSend([]verbs.SendWR{writeImm(1, x.mr, y.mr, 0, 8)}); err != nil {
			b.Fatal(err)
		}
		for _, cq := range []verbs.CQ{x.cq, y.cq} {
			for got := 0; got == 0; {
				if got, err = cq.Poll(wc[:1]); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	cq := y.cq.(*CQ)
	if n := len(cq.feederList()); n != qps {
		b.Fatalf("%d QPs feed the CQ, want %d", n, qps)
	}
	b.ReportAllocs()
	for b.Loop() {
		cq.drive()
	}
}
