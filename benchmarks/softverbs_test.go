package benchmarks

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
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
//   - Placed/<size>: the ceiling of read-side placement, which rsock does not do: the
//     reader, on its own goroutine, advertises its buffer (its address and key, written
//     with immediate into the writer's ring), and the writer writes its message straight
//     into that buffer and waits for the next advertisement. One copy per byte, as in
//     WriteWithImm, but with a socket's two parties and a hand-off each way per message.
//
// WriteWithImm is the stream workload on the SoftVerbs transport, run as BenchmarkStream
// runs it. The ping-pongs build on the workload package's QP pair but keep loops of
// their own: the workloads have no two-goroutine ping-pong, and their one-goroutine
// pingpong reads the clock twice per round trip for its percentiles and posts 64-byte
// messages inline, which PingPong64BOneGoroutine leaves out to time the bare exchange.
func BenchmarkSoftVerbs(b *testing.B) {
	stream, ok := workload.LookupWorkload(workload.Stream)
	if !ok {
		b.Fatal("no stream workload")
	}
	softVerbs, ok := workload.Lookup(workload.SoftVerbs)
	if !ok {
		b.Fatal("no SoftVerbs transport")
	}
	for _, size := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
		// The stream workload on SoftVerbs, as BenchmarkStream runs it, on a fresh fabric.
		b.Run("WriteWithImm/"+workload.SizeName(size), func(b *testing.B) {
			runBench(b, stream, startEnv(b, softVerbs), workload.Params{Size: size, Conns: 1})
		})
	}
	b.Run("PingPong64B", benchSoftPingPong)
	b.Run("PingPong64BOneGoroutine", benchSoftPingPongOneGoroutine)
	for _, size := range []int{64 << 10, 1 << 20} {
		b.Run("Placed/"+workload.SizeName(size), func(b *testing.B) { benchSoftPlaced(b, size) })
	}
}

// benchSoftPlaced moves size-byte messages from x's source region into y's ring,
// which stands for the buffer a Read names, each only once y has advertised it.
func benchSoftPlaced(b *testing.B, size int) {
	x, y := newSoftVerbsPair(b, size, max(size, 1<<16))
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Go(func() { errs <- svAdvertise(y, x, &stop) })

	wr := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: x.Src.Addr(), Length: uint32(size), LKey: x.Src.LKey()}},
	}}
	repost := []verbs.RecvWR{{}}
	var wc [1]verbs.WorkCompletion
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if err := svWait(x.RCQ, wc[:], nil); err != nil {
			b.Fatal("advertisement: ", err)
		}
		repost[0].ID = wc[0].WRID
		if err := x.QP.PostRecv(repost); err != nil {
			b.Fatal(err)
		}
		adv := x.Ring.Bytes()[:svAdvertLen]
		wr[0].RemoteAddr = binary.LittleEndian.Uint64(adv)
		wr[0].RKey = binary.LittleEndian.Uint32(adv[8:])
		if err := x.QP.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if err := svWait(x.SCQ, wc[:], nil); err != nil {
			b.Fatal("write: ", err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// svAdvertLen is the length of benchSoftPlaced's advertisement: address and key.
const svAdvertLen = 16

// svAdvertise plays benchSoftPlaced's reader: it advertises e's ring to peer and waits
// for the message written into it, until stop is set.
func svAdvertise(e, peer *workload.SoftEndpoint, stop *atomic.Bool) error {
	binary.LittleEndian.PutUint64(e.Src.Bytes(), e.Ring.Addr())
	binary.LittleEndian.PutUint32(e.Src.Bytes()[8:], e.Ring.RKey())
	adv := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendInline | verbs.SendSignaled,
		SGL:        []verbs.SGE{{Addr: e.Src.Addr(), Length: svAdvertLen, LKey: e.Src.LKey()}},
		RemoteAddr: peer.Ring.Addr(), RKey: peer.Ring.RKey(),
	}}
	repost := []verbs.RecvWR{{}}
	var wc [1]verbs.WorkCompletion
	for !stop.Load() {
		if err := e.QP.PostSend(adv); err != nil {
			return err
		}
		if err := svWait(e.SCQ, wc[:], stop); err != nil {
			return fmt.Errorf("advertise: %w", err)
		}
		if err := svWait(e.RCQ, wc[:], stop); err != nil {
			return fmt.Errorf("message: %w", err)
		}
		if stop.Load() {
			break
		}
		repost[0].ID = wc[0].WRID
		if err := e.QP.PostRecv(repost); err != nil {
			return err
		}
	}
	return nil
}

// svWait polls cq until it yields one successful completion into wc[0], yielding the
// processor after every empty poll, as rsock's waiters do; it gives up without error
// once stop (if not nil) is set.
func svWait(cq verbs.CQ, wc []verbs.WorkCompletion, stop *atomic.Bool) error {
	for {
		n, err := cq.Poll(wc[:1])
		switch {
		case err != nil:
			return err
		case n == 1 && wc[0].Status != verbs.WCSuccess:
			return fmt.Errorf("completion %+v", wc[0])
		case n == 1:
			return nil
		case stop != nil && stop.Load():
			return nil
		}
		runtime.Gosched()
	}
}

// svSignalEvery is how many WRs make a signaled send, and how many completions a
// receive batch, as in the workloads.
const svSignalEvery = workload.SoftSignalEvery

// newSoftVerbsPair connects two QPs on two devices of a fresh fabric, as the workloads'
// raw soft-verbs transport does, and releases them when b ends. Each side sends from a
// region of srcSize bytes into the other's ring of ringSize bytes, and has
// workload.SoftDepth receive WQEs posted.
func newSoftVerbsPair(b *testing.B, srcSize, ringSize int) (x, y *workload.SoftEndpoint) {
	b.Helper()
	x, y, closePair, err := workload.NewSoftPair(soft.New(soft.Options{Devices: 2}), srcSize, ringSize)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := closePair(); err != nil {
			b.Error(err)
		}
	})
	return x, y
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
		SGL:        []verbs.SGE{{Addr: x.Src.Addr(), Length: size, LKey: x.Src.LKey()}},
		RemoteAddr: y.Ring.Addr(), RKey: y.Ring.RKey(),
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
		if err := x.QP.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for spins := 0; ; spins++ {
			n, err := x.RCQ.Poll(wc[:1])
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
		if err := x.QP.PostRecv(repost); err != nil {
			b.Fatal(err)
		}
		if i%svSignalEvery == svSignalEvery-1 {
			reapSignaled(b, x.SCQ, wc[:1])
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
func svEcho(e, peer *workload.SoftEndpoint, size int, stop *atomic.Bool) error {
	wr := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendInline,
		SGL:        []verbs.SGE{{Addr: e.Src.Addr(), Length: uint32(size), LKey: e.Src.LKey()}},
		RemoteAddr: peer.Ring.Addr(), RKey: peer.Ring.RKey(),
	}}
	repost := []verbs.RecvWR{{}}
	var wc [svSignalEvery]verbs.WorkCompletion
	for sent, spins := 0, 0; !stop.Load(); {
		n, err := e.RCQ.Poll(wc[:1])
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
		if err := e.QP.PostRecv(repost); err != nil {
			return err
		}
		wr[0].ID, wr[0].Imm = uint64(sent), wc[0].Imm
		wr[0].Flags = verbs.SendInline
		if sent%svSignalEvery == svSignalEvery-1 {
			wr[0].Flags |= verbs.SendSignaled
		}
		if err := e.QP.PostSend(wr); err != nil {
			return err
		}
		if sent%svSignalEvery == svSignalEvery-1 {
			if n, err := e.SCQ.Poll(wc[:1]); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
				return fmt.Errorf("echo: send completion %d %v %+v", n, err, wc[0])
			}
		}
		sent++
	}
	return nil
}

func benchSoftPingPongOneGoroutine(b *testing.B) {
	const size = 64
	x, y := newSoftVerbsPair(b, size, 1<<16)
	ping := []verbs.SendWR{{
		Opcode:     verbs.OpRDMAWriteWithImm,
		SGL:        []verbs.SGE{{Addr: x.Src.Addr(), Length: size, LKey: x.Src.LKey()}},
		RemoteAddr: y.Ring.Addr(), RKey: y.Ring.RKey(),
	}}
	pong := []verbs.SendWR{{
		Opcode:     verbs.OpRDMAWriteWithImm,
		SGL:        []verbs.SGE{{Addr: y.Src.Addr(), Length: size, LKey: y.Src.LKey()}},
		RemoteAddr: x.Ring.Addr(), RKey: x.Ring.RKey(),
	}}
	repost := []verbs.RecvWR{{}}
	wc := make([]verbs.WorkCompletion, 1)
	// hop moves one message: post it on from, reap it on to's receive CQ, repost there.
	hop := func(wr []verbs.SendWR, from, to *workload.SoftEndpoint, i int) {
		wr[0].ID, wr[0].Imm, wr[0].Flags = uint64(i), uint32(i), 0
		if i%svSignalEvery == svSignalEvery-1 {
			wr[0].Flags = verbs.SendSignaled
		}
		if err := from.QP.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if n, err := to.RCQ.Poll(wc); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
			b.Fatalf("receive: %d %v %+v", n, err, wc[0])
		}
		repost[0].ID = wc[0].WRID
		if err := to.QP.PostRecv(repost); err != nil {
			b.Fatal(err)
		}
		if i%svSignalEvery == svSignalEvery-1 {
			reapSignaled(b, from.SCQ, wc)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		hop(ping, x, y, i)
		hop(pong, y, x, i)
	}
}

// reapSignaled polls, into wc, the one signaled send completion that frees the last
// batch's slots. (wc comes from the caller: a local array would escape to the heap
// through the interface call.)
func reapSignaled(b *testing.B, cq verbs.CQ, wc []verbs.WorkCompletion) {
	if err := workload.ReapSignaled(cq, wc); err != nil {
		b.Fatal(err)
	}
}
