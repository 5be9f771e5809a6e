package benchmarks

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// BenchmarkSoftVerbs measures the raw software provider: the ceiling that rsock's RDMA
// path over verbs/soft is measured against.
//
//   - WriteWithImm/<size>: one-way stream of RDMA_WRITE_WITH_IMM into a ring region of
//     the peer. One goroutine plays both sides, as a sender and a receiver sharing a core
//     would: every 16 writes it polls the one signaled send completion and the receiver
//     reaps 16 receive completions and reposts their WQEs in one PostRecv.
//   - PingPong64B: a 64-byte write-with-immediate and its 64-byte answer, the receiver
//     spinning on its CQ in its own goroutine. It reports round-trip percentiles; on a
//     loaded machine they mostly measure how long the OS keeps a spinning thread off-CPU.
//   - PingPong64BOneGoroutine: the same exchange driven by one goroutine, which polls each
//     side in turn: the provider's own round-trip cost, without a cross-core handoff.
func BenchmarkSoftVerbs(b *testing.B) {
	for _, size := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
		b.Run("WriteWithImm/"+sizeName(size), func(b *testing.B) { benchSoftWriteWithImm(b, size) })
	}
	b.Run("PingPong64B", benchSoftPingPong)
	b.Run("PingPong64BOneGoroutine", benchSoftPingPongOneGoroutine)
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// Batch sizes of the benchmarks: WRs per signaled send, completions per poll and receive
// WQEs per repost.
const (
	svSignalEvery = 16
	svDepth       = 256 // send and receive queue depth
)

// svEndpoint is one side of a benchmark connection.
type svEndpoint struct {
	ctx      verbs.Context
	pd       verbs.PD
	scq, rcq verbs.CQ
	qp       verbs.QP
	src      verbs.MR // what this side sends from
	ring     verbs.MR // where the peer writes
	gid      verbs.GID
	psn      uint32
}

// newSoftVerbsPair connects two QPs on two devices of a fresh fabric. Each side sends from
// a region of srcSize bytes into the other's ring of ringSize bytes, and has svDepth
// receive WQEs posted.
func newSoftVerbsPair(b *testing.B, srcSize, ringSize int) (x, y *svEndpoint) {
	b.Helper()
	fab := soft.New(soft.Options{Devices: 2})
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	open := func(dev string, psn uint32) *svEndpoint {
		e := &svEndpoint{psn: psn}
		var err error
		e.ctx, err = fab.Open(dev)
		must(err)
		e.gid = e.ctx.Device().Ports[0].GIDs[1].GID
		e.pd, err = e.ctx.AllocPD()
		must(err)
		e.scq, err = e.ctx.CreateCQ(2*svDepth, nil)
		must(err)
		e.rcq, err = e.ctx.CreateCQ(2*svDepth, nil)
		must(err)
		e.src, err = e.pd.RegMR(srcSize, verbs.AccessLocalWrite)
		must(err)
		e.ring, err = e.pd.RegMR(ringSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		must(err)
		e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq,
			Caps: verbs.QPCaps{MaxSendWR: svDepth, MaxRecvWR: svDepth, MaxSendSGE: 1, MaxInlineData: 64}})
		must(err)
		must(e.qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite}))
		for i := range svDepth {
			must(e.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}))
		}
		b.Cleanup(func() {
			for _, c := range []interface{ Close() error }{e.qp, e.src, e.ring, e.scq, e.rcq, e.pd, e.ctx} {
				must(c.Close())
			}
		})
		return e
	}
	x, y = open("soft0", 100), open("soft1", 200)
	connect := func(e, peer *svEndpoint) {
		must(e.qp.ToRTR(verbs.RTRAttr{
			PathMTU: verbs.MTU4096, DestQPN: peer.qp.QPN(), RQPSN: peer.psn, MinRNRTimer: 1,
			Dest: verbs.AddressVector{Port: 1, IsGlobal: true, DestGID: peer.gid, SGIDIndex: 1, HopLimit: 64},
		}))
	}
	connect(x, y)
	connect(y, x)
	must(x.qp.ToRTS(verbs.RTSAttr{SQPSN: x.psn, Timeout: 14, RetryCount: 7, RNRRetry: 7}))
	must(y.qp.ToRTS(verbs.RTSAttr{SQPSN: y.psn, Timeout: 14, RetryCount: 7, RNRRetry: 7}))
	return x, y
}

func benchSoftWriteWithImm(b *testing.B, size int) {
	ringSize := max(8*size, 1<<20)
	x, y := newSoftVerbsPair(b, size, ringSize)
	wr := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Imm: uint32(size),
		SGL:  []verbs.SGE{{Addr: x.src.Addr(), Length: uint32(size), LKey: x.src.LKey()}},
		RKey: y.ring.RKey(),
	}}
	var reposts [svSignalEvery]verbs.RecvWR
	wc := make([]verbs.WorkCompletion, svSignalEvery)
	fail := func(what string, err error) { b.Fatalf("%s: %v", what, err) }

	b.SetBytes(int64(size))
	b.ReportAllocs()
	var i uint64
	for b.Loop() {
		wr[0].ID = i
		wr[0].RemoteAddr = y.ring.Addr() + i*uint64(size)%uint64(ringSize)
		wr[0].Flags = 0
		if i%svSignalEvery == svSignalEvery-1 {
			wr[0].Flags = verbs.SendSignaled
		}
		if err := x.qp.PostSend(wr); err != nil {
			fail("post", err)
		}
		i++
		if i%svSignalEvery != 0 {
			continue
		}
		// The sender reaps its signaled completion; the receiver its 16 receives.
		if n, err := x.scq.Poll(wc[:1]); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
			b.Fatalf("send completion: %d %v %+v", n, err, wc[0])
		}
		got := 0
		for got < svSignalEvery {
			n, err := y.rcq.Poll(wc[got:])
			if err != nil {
				fail("poll receives", err)
			}
			for _, c := range wc[got : got+n] {
				if c.Status != verbs.WCSuccess {
					b.Fatalf("receive completion %+v", c)
				}
			}
			got += n
		}
		for k := range reposts {
			reposts[k].ID = wc[k].WRID
		}
		if err := y.qp.PostRecv(reposts[:]); err != nil {
			fail("repost", err)
		}
	}
}

func benchSoftPingPong(b *testing.B) {
	const size = 64
	x, y := newSoftVerbsPair(b, size, 1<<16)

	// y answers every message it receives, from its own goroutine.
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Go(func() { errs <- svEcho(y, x, size, &stop) })

	wr := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendInline,
		SGL:        []verbs.SGE{{Addr: x.src.Addr(), Length: size, LKey: x.src.LKey()}},
		RemoteAddr: y.ring.Addr(), RKey: y.ring.RKey(),
	}}
	repost := []verbs.RecvWR{{}}
	var wc [svSignalEvery]verbs.WorkCompletion
	samples := make([]time.Duration, 1<<20)

	b.ReportAllocs()
	var i int
	for b.Loop() {
		start := time.Now()
		wr[0].ID, wr[0].Imm = uint64(i), uint32(i)
		wr[0].Flags = verbs.SendInline
		if i%svSignalEvery == svSignalEvery-1 {
			wr[0].Flags |= verbs.SendSignaled
		}
		if err := x.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for spins := 0; ; spins++ {
			n, err := x.rcq.Poll(wc[:1])
			if err != nil {
				b.Fatal(err)
			}
			if n == 1 {
				break
			}
			if spins%1024 == 1023 {
				runtime.Gosched()
			}
		}
		samples[i%len(samples)] = time.Since(start)
		if wc[0].Status != verbs.WCSuccess || wc[0].Imm != uint32(i) {
			b.Fatalf("answer %d: %+v", i, wc[0])
		}
		repost[0].ID = wc[0].WRID
		if err := x.qp.PostRecv(repost); err != nil {
			b.Fatal(err)
		}
		if i%svSignalEvery == svSignalEvery-1 {
			svReapSignaled(b, x.scq, wc[:1])
		}
		i++
	}
	stop.Store(true)
	wg.Wait()
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	s := slices.Clone(samples[:min(i, len(samples))])
	slices.Sort(s)
	if len(s) > 0 {
		pct := func(p float64) float64 { return float64(s[int(p*float64(len(s)-1))].Nanoseconds()) }
		b.ReportMetric(pct(0.50), "p50-ns")
		b.ReportMetric(pct(0.99), "p99-ns")
		b.ReportMetric(pct(0.999), "p999-ns")
	}
}

// svEcho answers each write-with-immediate e receives with one of the same size and
// immediate, until stop is set.
func svEcho(e, peer *svEndpoint, size int, stop *atomic.Bool) error {
	wr := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendInline,
		SGL:        []verbs.SGE{{Addr: e.src.Addr(), Length: uint32(size), LKey: e.src.LKey()}},
		RemoteAddr: peer.ring.Addr(), RKey: peer.ring.RKey(),
	}}
	repost := []verbs.RecvWR{{}}
	var wc [svSignalEvery]verbs.WorkCompletion
	for sent, spins := 0, 0; !stop.Load(); {
		n, err := e.rcq.Poll(wc[:1])
		if err != nil {
			return err
		}
		if n == 0 {
			if spins++; spins%1024 == 0 {
				runtime.Gosched()
			}
			continue
		}
		if wc[0].Status != verbs.WCSuccess {
			return fmt.Errorf("echo: receive %+v", wc[0])
		}
		repost[0].ID = wc[0].WRID
		if err := e.qp.PostRecv(repost); err != nil {
			return err
		}
		wr[0].ID, wr[0].Imm = uint64(sent), wc[0].Imm
		wr[0].Flags = verbs.SendInline
		if sent%svSignalEvery == svSignalEvery-1 {
			wr[0].Flags |= verbs.SendSignaled
		}
		if err := e.qp.PostSend(wr); err != nil {
			return err
		}
		if sent%svSignalEvery == svSignalEvery-1 {
			if n, err := e.scq.Poll(wc[:1]); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
				return fmt.Errorf("echo: send completion %d %v %+v", n, err, wc[0])
			}
		}
		sent++
	}
	return nil
}

// svReapSignaled polls, into wc, the one signaled send completion that frees the last
// batch's slots. (wc comes from the caller: a local array would escape to the heap
// through the interface call.)
func svReapSignaled(b *testing.B, cq verbs.CQ, wc []verbs.WorkCompletion) {
	for {
		n, err := cq.Poll(wc)
		if err != nil || (n == 1 && wc[0].Status != verbs.WCSuccess) {
			b.Fatalf("send completion: %v %+v", err, wc[0])
		}
		if n == 1 {
			return
		}
	}
}

func benchSoftPingPongOneGoroutine(b *testing.B) {
	const size = 64
	x, y := newSoftVerbsPair(b, size, 1<<16)
	ping := []verbs.SendWR{{
		Opcode:     verbs.OpRDMAWriteWithImm,
		SGL:        []verbs.SGE{{Addr: x.src.Addr(), Length: size, LKey: x.src.LKey()}},
		RemoteAddr: y.ring.Addr(), RKey: y.ring.RKey(),
	}}
	pong := []verbs.SendWR{{
		Opcode:     verbs.OpRDMAWriteWithImm,
		SGL:        []verbs.SGE{{Addr: y.src.Addr(), Length: size, LKey: y.src.LKey()}},
		RemoteAddr: x.ring.Addr(), RKey: x.ring.RKey(),
	}}
	repost := []verbs.RecvWR{{}}
	wc := make([]verbs.WorkCompletion, 1)
	// hop moves one message: post it on from, reap it on to's receive CQ, repost there.
	hop := func(wr []verbs.SendWR, from, to *svEndpoint, i int) {
		wr[0].ID, wr[0].Imm, wr[0].Flags = uint64(i), uint32(i), 0
		if i%svSignalEvery == svSignalEvery-1 {
			wr[0].Flags = verbs.SendSignaled
		}
		if err := from.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if n, err := to.rcq.Poll(wc); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
			b.Fatalf("receive: %d %v %+v", n, err, wc[0])
		}
		repost[0].ID = wc[0].WRID
		if err := to.qp.PostRecv(repost); err != nil {
			b.Fatal(err)
		}
		if i%svSignalEvery == svSignalEvery-1 {
			svReapSignaled(b, from.scq, wc)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		hop(ping, x, y, i)
		hop(pong, y, x, i)
	}
}
