package soft_test

import (
	"fmt"
	"testing"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// benchEnd is one end of the benchmarks' connection, with one CQ for both queues.
type benchEnd struct {
	ctx verbs.Context
	pd  verbs.PD
	cq  verbs.CQ
	qp  verbs.QP
	mr  verbs.MR
	gid verbs.GID
}

func newBenchEnd(b *testing.B, f *soft.Fabric, dev string, size int) *benchEnd {
	b.Helper()
	e := &benchEnd{}
	var err error
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	e.ctx, err = f.Open(dev)
	must(err)
	e.gid = e.ctx.Device().Ports[0].GIDs[1].GID
	e.pd, err = e.ctx.AllocPD()
	must(err)
	e.cq, err = e.ctx.CreateCQ(64, nil, 0)
	must(err)
	e.mr, err = e.pd.RegMR(size, access)
	must(err)
	e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq,
		Caps: verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	must(err)
	must(e.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	b.Cleanup(func() {
		for _, c := range []interface{ Close() error }{e.qp, e.mr, e.cq, e.pd, e.ctx} {
			must(c.Close())
		}
	})
	return e
}

// connectBenchEnds brings x and y to RTS, connected to each other.
func connectBenchEnds(b *testing.B, x, y *benchEnd) {
	b.Helper()
	for _, p := range [][2]*benchEnd{{x, y}, {y, x}} {
		err := p[0].qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: p[1].qp.QPN(), RQPSN: 0x100,
			Dest: verbs.AddressVector{Port: 1, IsGlobal: true, DestGID: p[1].gid, SGIDIndex: 1, HopLimit: 64}, MinRNRTimer: 1})
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, e := range []*benchEnd{x, y} {
		if err := e.qp.ToRTS(verbs.RTSAttr{SQPSN: 0x100, Timeout: 14, RetryCount: 3, RNRRetry: 7}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteWithImm: one signaled RDMA WRITE_WITH_IMM at a time between two devices
// of a fabric: post, poll the sender's and the receiver's completions, post the receive
// again. It is the soft provider's cost per WR under the rsock engine's pattern.
func BenchmarkWriteWithImm(b *testing.B) {
	for _, size := range []int{64, 64 << 10} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			f := soft.New(soft.Options{Devices: 2})
			x := newBenchEnd(b, f, "soft0", size)
			y := newBenchEnd(b, f, "soft1", size)
			connectBenchEnds(b, x, y)
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
