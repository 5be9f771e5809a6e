package workload

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// The raw soft-verbs workloads measure verbs/soft without rsock: the ceiling of rsock's
// RDMA path on that provider. BenchmarkSoftVerbs in benchmarks/softverbs_test.go runs
// softStream as it is, and builds its ping-pongs on NewSoftPair and ReapSignaled, so
// that figures from either compare.

const (
	SoftSignalEvery = 16  // WRs per signaled send, completions per receive batch
	SoftDepth       = 256 // send and receive queue depth
)

// SoftEndpoint is one side of a raw soft-verbs connection.
type SoftEndpoint struct {
	ctx      verbs.Context
	pd       verbs.PD
	SCQ, RCQ verbs.CQ // send and receive completion queues
	QP       verbs.QP
	Src      verbs.MR // what this side sends from
	Ring     verbs.MR // where the peer writes
	gid      verbs.GID
	psn      uint32
}

func (e *SoftEndpoint) close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{e.QP, e.Src, e.Ring, e.SCQ, e.RCQ, e.pd, e.ctx} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// NewSoftPair connects two QPs on devices soft0 and soft1 of fab. Each side sends from a
// region of srcSize bytes into the other's ring of ringSize bytes and has SoftDepth
// receive WQEs posted, with IDs 0 to SoftDepth-1. close releases both.
func NewSoftPair(fab *soft.Fabric, srcSize, ringSize int) (x, y *SoftEndpoint, close func() error, err error) {
	var eps []*SoftEndpoint
	close = func() error {
		var errs []error
		for _, e := range eps {
			errs = append(errs, e.close())
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			close()
		}
	}()
	open := func(dev string, psn uint32) (*SoftEndpoint, error) {
		e := &SoftEndpoint{psn: psn}
		eps = append(eps, e)
		var err error
		if e.ctx, err = fab.Open(dev); err != nil {
			return nil, err
		}
		e.gid = e.ctx.Device().Ports[0].GIDs[1].GID
		if e.pd, err = e.ctx.AllocPD(); err != nil {
			return nil, err
		}
		if e.SCQ, err = e.ctx.CreateCQ(2*SoftDepth, nil, 0); err != nil {
			return nil, err
		}
		if e.RCQ, err = e.ctx.CreateCQ(2*SoftDepth, nil, 0); err != nil {
			return nil, err
		}
		if e.Src, err = e.pd.RegMR(srcSize, verbs.AccessLocalWrite); err != nil {
			return nil, err
		}
		if e.Ring, err = e.pd.RegMR(ringSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
			return nil, err
		}
		e.QP, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.SCQ, RecvCQ: e.RCQ,
			Caps: verbs.QPCaps{MaxSendWR: SoftDepth, MaxRecvWR: SoftDepth, MaxSendSGE: 1, MaxInlineData: 64}})
		if err != nil {
			return nil, err
		}
		if err := e.QP.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite}); err != nil {
			return nil, err
		}
		for i := range SoftDepth {
			if err := e.QP.PostRecv([]verbs.RecvWR{{ID: uint64(i)}}); err != nil {
				return nil, err
			}
		}
		return e, nil
	}
	if x, err = open("soft0", 100); err != nil {
		return nil, nil, close, err
	}
	if y, err = open("soft1", 200); err != nil {
		return nil, nil, close, err
	}
	connect := func(e, peer *SoftEndpoint) error {
		return e.QP.ToRTR(verbs.RTRAttr{
			PathMTU: verbs.MTU4096, DestQPN: peer.QP.QPN(), RQPSN: peer.psn, MinRNRTimer: 1,
			Dest: verbs.AddressVector{Port: 1, IsGlobal: true, DestGID: peer.gid, SGIDIndex: 1, HopLimit: 64},
		})
	}
	if err = errors.Join(connect(x, y), connect(y, x)); err != nil {
		return nil, nil, close, err
	}
	err = errors.Join(
		x.QP.ToRTS(verbs.RTSAttr{SQPSN: x.psn, Timeout: 14, RetryCount: 7, RNRRetry: 7}),
		y.QP.ToRTS(verbs.RTSAttr{SQPSN: y.psn, Timeout: 14, RetryCount: 7, RNRRetry: 7}))
	if err != nil {
		return nil, nil, close, err
	}
	return x, y, close, nil
}

// softStream posts size-byte RDMA_WRITE_WITH_IMMs into the peer's ring. One goroutine
// plays both sides, as a sender and a receiver sharing a core would: every 16 writes it
// polls the one signaled send completion, and the receiver reaps 16 receive
// completions and reposts their WQEs in one PostRecv.
//
// With copies (SoftVerbs3Copy), it is the stream a socket must make instead
// (softStreamCopying): two parties, and a socket's copies.
func softStream(ctl Control, env *Env, size int, copies bool) (_ Metrics, err error) {
	ringSize := max(8*size, 1<<20)
	x, y, closePair, err := NewSoftPair(env.fabric, size, ringSize)
	if err != nil {
		return Metrics{}, err
	}
	defer func() { err = errors.Join(err, closePair()) }()
	if copies {
		return softStreamCopying(ctl, x, y, size)
	}
	wr := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Imm: uint32(size),
		SGL:  []verbs.SGE{{Addr: x.Src.Addr(), Length: uint32(size), LKey: x.Src.LKey()}},
		RKey: y.Ring.RKey(),
	}}
	var reposts [SoftSignalEvery]verbs.RecvWR
	wc := make([]verbs.WorkCompletion, SoftSignalEvery)
	var i uint64
	for ctl.Next() {
		wr[0].ID = i
		wr[0].RemoteAddr = y.Ring.Addr() + i*uint64(size)%uint64(ringSize)
		wr[0].Flags = 0
		if i%SoftSignalEvery == SoftSignalEvery-1 {
			wr[0].Flags = verbs.SendSignaled
		}
		if err := x.QP.PostSend(wr); err != nil {
			return Metrics{}, fmt.Errorf("post: %w", err)
		}
		i++
		if i%SoftSignalEvery != 0 {
			continue
		}
		if n, err := x.SCQ.Poll(wc[:1]); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
			return Metrics{}, fmt.Errorf("send completion: %d %v %+v", n, err, wc[0])
		}
		for got := 0; got < SoftSignalEvery; {
			n, err := y.RCQ.Poll(wc[got:])
			if err != nil {
				return Metrics{}, fmt.Errorf("poll receives: %w", err)
			}
			for _, c := range wc[got : got+n] {
				if c.Status != verbs.WCSuccess {
					return Metrics{}, fmt.Errorf("receive completion %+v", c)
				}
			}
			got += n
		}
		for k := range reposts {
			reposts[k].ID = wc[k].WRID
		}
		if err := y.QP.PostRecv(reposts[:]); err != nil {
			return Metrics{}, fmt.Errorf("repost: %w", err)
		}
	}
	return Metrics{BytesPerOp: int64(size)}, nil
}

// softStreamCopying is SoftVerbs3Copy's stream: the least a socket's stream can cost on
// soft. x writes from the caller's goroutine: it copies an application buffer into its
// registered source region (a socket's staging) and posts it into the next of y's ring
// slots. y reads on its own goroutine (softDrain): it copies each message out of the
// ring into its application buffer, reposts the WQEs, and gives the slots back. Credit
// goes back for free, through a counter the writer reads, where a socket sends it as a
// message, and the writer waits for it spinning, yielding the processor between looks.
// Next to SoftVerbs, the ratio is what the copies and a socket's two parties (two
// cores, when there are two: the reader's copy reads what another core wrote) cost;
// next to it, RsockRDMA's ratio is the socket layer's own.
func softStreamCopying(ctl Control, x, y *SoftEndpoint, size int) (_ Metrics, err error) {
	slots := uint64(min(len(y.Ring.Bytes())/size, SoftDepth)) // a slot per receive WQE at most
	var consumed atomic.Uint64                                // messages y read and reposted for: x's credit
	var stop atomic.Bool
	drained := make(chan error, 1)
	readBuf := make([]byte, size)
	go func() { drained <- softDrain(y, readBuf, slots, &consumed, &stop) }()
	defer func() {
		stop.Store(true)
		if drainErr := <-drained; drainErr != nil {
			err = errors.Join(err, fmt.Errorf("reader: %w", drainErr))
		}
	}()
	app := make([]byte, size)
	wr := []verbs.SendWR{{
		Opcode: verbs.OpRDMAWriteWithImm, Imm: uint32(size),
		SGL:  []verbs.SGE{{Addr: x.Src.Addr(), Length: uint32(size), LKey: x.Src.LKey()}},
		RKey: y.Ring.RKey(),
	}}
	wc := make([]verbs.WorkCompletion, 1)
	for i := uint64(0); ctl.Next(); i++ {
		for i-consumed.Load() >= slots {
			if stop.Load() {
				return Metrics{}, errSoftStopped // with the reader's failure
			}
			runtime.Gosched()
		}
		copy(x.Src.Bytes(), app)
		wr[0].ID = i
		wr[0].RemoteAddr = y.Ring.Addr() + i%slots*uint64(size)
		wr[0].Flags = 0
		if i%SoftSignalEvery == SoftSignalEvery-1 {
			wr[0].Flags = verbs.SendSignaled
		}
		if err := x.QP.PostSend(wr); err != nil {
			return Metrics{}, fmt.Errorf("post %d: %w", i, err)
		}
		if i%SoftSignalEvery == SoftSignalEvery-1 {
			if err := ReapSignaled(x.SCQ, wc); err != nil {
				return Metrics{}, err
			}
		}
	}
	return Metrics{BytesPerOp: int64(size)}, nil
}

// softDrain is softStreamCopying's reader: it reaps e's receive completions, copies each
// message out of its ring slot (of slots, len(app) bytes each) into app, reposts the
// WQEs and only then counts the messages in consumed, yielding the processor after
// every empty poll, until stop is set. When it fails, it sets stop itself, so that the
// writer does not wait for credit forever.
func softDrain(e *SoftEndpoint, app []byte, slots uint64, consumed *atomic.Uint64, stop *atomic.Bool) (err error) {
	defer func() {
		if err != nil {
			stop.Store(true)
		}
	}()
	size := uint64(len(app))
	ring := e.Ring.Bytes()
	var wc [SoftSignalEvery]verbs.WorkCompletion
	var reposts [SoftSignalEvery]verbs.RecvWR
	for read := uint64(0); !stop.Load(); {
		n, err := e.RCQ.Poll(wc[:])
		if err != nil {
			return fmt.Errorf("poll receives: %w", err)
		}
		if n == 0 {
			runtime.Gosched()
			continue
		}
		for k, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				return fmt.Errorf("receive completion %+v", c)
			}
			off := read % slots * size
			copy(app, ring[off:off+min(uint64(c.ByteLen), size)])
			read++
			reposts[k].ID = c.WRID
		}
		if err := e.QP.PostRecv(reposts[:n]); err != nil {
			return fmt.Errorf("repost: %w", err)
		}
		consumed.Store(read) // the slots and their WQEs are the writer's again
	}
	return nil
}

// softPingPong sends a size-byte write-with-immediate from one QP to the other and the
// answer back, one goroutine driving both sides in turn as BenchmarkSoftVerbs's
// PingPong64BOneGoroutine does: the provider's own round-trip cost, without the hand-off
// between goroutines (or cores) that a two-party exchange adds. Each message lands at
// the start of a ring that holds it, 64 KiB at least.
//
// With copies (SoftVerbs3Copy), it is the exchange a socket must make instead
// (softPingPongEcho): two parties, each copying every message from an application
// buffer into its registered source region before posting it, and out of its ring into
// an application buffer after reaping it.
func softPingPong(ctl Control, env *Env, size int, copies bool) (_ Metrics, err error) {
	x, y, closePair, err := NewSoftPair(env.fabric, size, max(size, 1<<16))
	if err != nil {
		return Metrics{}, err
	}
	defer func() { err = errors.Join(err, closePair()) }()
	if copies {
		return softPingPongEcho(ctl, x, y, size)
	}
	flags := verbs.SendFlags(0)
	if size <= 64 {
		flags = verbs.SendInline
	}
	write := func(from, to *SoftEndpoint) []verbs.SendWR {
		return []verbs.SendWR{{
			Opcode:     verbs.OpRDMAWriteWithImm,
			SGL:        []verbs.SGE{{Addr: from.Src.Addr(), Length: uint32(size), LKey: from.Src.LKey()}},
			RemoteAddr: to.Ring.Addr(), RKey: to.Ring.RKey(),
		}}
	}
	ping, pong := write(x, y), write(y, x)
	repost := []verbs.RecvWR{{}}
	wc := make([]verbs.WorkCompletion, 1)
	// hop moves one message: post it on from, reap it on to's receive CQ, repost there.
	hop := func(wr []verbs.SendWR, from, to *SoftEndpoint, i int) error {
		wr[0].ID, wr[0].Imm, wr[0].Flags = uint64(i), uint32(i), flags
		if i%SoftSignalEvery == SoftSignalEvery-1 {
			wr[0].Flags |= verbs.SendSignaled
		}
		if err := from.QP.PostSend(wr); err != nil {
			return err
		}
		if n, err := to.RCQ.Poll(wc); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess || wc[0].Imm != uint32(i) {
			return fmt.Errorf("receive %d: %d %v %+v", i, n, err, wc[0])
		}
		repost[0].ID = wc[0].WRID
		if err := to.QP.PostRecv(repost); err != nil {
			return err
		}
		if i%SoftSignalEvery == SoftSignalEvery-1 {
			return ReapSignaled(from.SCQ, wc)
		}
		return nil
	}
	rec := newRecorder()
	for i := 0; ctl.Next(); i++ {
		start := time.Now()
		if err := hop(ping, x, y, i); err != nil {
			return Metrics{}, err
		}
		if err := hop(pong, y, x, i); err != nil {
			return Metrics{}, err
		}
		rec.add(time.Since(start))
	}
	return Metrics{BytesPerOp: 2 * int64(size), Latency: rec.percentiles()}, nil
}

// softPingPongEcho is SoftVerbs3Copy's ping-pong: the least a socket's round trip can
// cost on soft. x pings from the caller's goroutine and y answers from its own, each
// spinning on its receive CQ (a Gosched every softSpinYield empty polls, so that
// neither starves the other on one processor), and each copies every message in from
// and out to an application buffer, as BenchmarkSoftVerbs's two-goroutine PingPong64B
// does without the copies. Next to SoftVerbs, the ratio is what the copies and the
// hand-off between two goroutines (two cores, when there are two) cost; next to it,
// RsockRDMA's ratio is the socket layer's own.
func softPingPongEcho(ctl Control, x, y *SoftEndpoint, size int) (_ Metrics, err error) {
	var stop atomic.Bool
	echoed := make(chan error, 1)
	go func() { echoed <- softEcho(y, x, size, &stop) }()
	defer func() {
		stop.Store(true)
		if echoErr := <-echoed; echoErr != nil {
			err = errors.Join(err, fmt.Errorf("echo: %w", echoErr))
		}
	}()
	ping := newSoftHop(x, y, size)
	rec := newRecorder()
	for i := 0; ctl.Next(); i++ {
		start := time.Now()
		if err := ping.send(i); err != nil {
			return Metrics{}, err
		}
		imm, err := ping.receive(&stop)
		if err != nil {
			return Metrics{}, err // with the echo's failure, when it stopped
		}
		if imm != uint32(i) {
			return Metrics{}, fmt.Errorf("answer %d: immediate %d", i, imm)
		}
		rec.add(time.Since(start))
	}
	return Metrics{BytesPerOp: 2 * int64(size), Latency: rec.percentiles()}, nil
}

// softEcho is softPingPongEcho's second party: it answers every message e receives
// with one of the same size and immediate, until stop is set. When it fails, it sets
// stop itself, so that the pinging party does not wait for an answer forever.
func softEcho(e, peer *SoftEndpoint, size int, stop *atomic.Bool) error {
	h := newSoftHop(e, peer, size)
	for i := 0; ; i++ {
		imm, err := h.receive(stop)
		if errors.Is(err, errSoftStopped) {
			return nil
		}
		if err == nil {
			err = h.sendImm(i, imm)
		}
		if err != nil {
			stop.Store(true)
			return err
		}
	}
}

// softSpinYield is how many empty polls a softHop's receive makes between Goscheds.
const softSpinYield = 1024

// errSoftStopped is a softHop's receive's when stop was set while it waited.
var errSoftStopped = errors.New("stopped")

// softHop is one party of softPingPongEcho: the messages it sends from its
// application buffer to peer, and those it receives into it.
type softHop struct {
	e      *SoftEndpoint
	app    []byte // the application's buffer: copied into Src to send, out of Ring on receipt
	wr     []verbs.SendWR
	repost []verbs.RecvWR
	wc     []verbs.WorkCompletion
}

func newSoftHop(e, peer *SoftEndpoint, size int) *softHop {
	flags := verbs.SendFlags(0)
	if size <= 64 {
		flags = verbs.SendInline
	}
	return &softHop{
		e:   e,
		app: make([]byte, size),
		wr: []verbs.SendWR{{
			Opcode: verbs.OpRDMAWriteWithImm, Flags: flags,
			SGL:        []verbs.SGE{{Addr: e.Src.Addr(), Length: uint32(size), LKey: e.Src.LKey()}},
			RemoteAddr: peer.Ring.Addr(), RKey: peer.Ring.RKey(),
		}},
		repost: []verbs.RecvWR{{}},
		wc:     make([]verbs.WorkCompletion, 1),
	}
}

func (h *softHop) send(i int) error { return h.sendImm(i, uint32(i)) }

// sendImm copies the application's buffer into the source region and posts it, the
// i-th message, with immediate imm; every SoftSignalEvery-th is signaled and reaped.
func (h *softHop) sendImm(i int, imm uint32) error {
	copy(h.e.Src.Bytes(), h.app)
	flags := h.wr[0].Flags &^ verbs.SendSignaled
	if i%SoftSignalEvery == SoftSignalEvery-1 {
		flags |= verbs.SendSignaled
	}
	h.wr[0].ID, h.wr[0].Imm, h.wr[0].Flags = uint64(i), imm, flags
	if err := h.e.QP.PostSend(h.wr); err != nil {
		return fmt.Errorf("post %d: %w", i, err)
	}
	if flags&verbs.SendSignaled != 0 {
		return ReapSignaled(h.e.SCQ, h.wc)
	}
	return nil
}

// receive spins until a message arrives (or stop is set), copies it out of the ring
// into the application's buffer, reposts its WQE and returns its immediate.
func (h *softHop) receive(stop *atomic.Bool) (uint32, error) {
	for spins := 1; ; spins++ {
		n, err := h.e.RCQ.Poll(h.wc)
		if err != nil {
			return 0, fmt.Errorf("poll: %w", err)
		}
		if n == 1 {
			break
		}
		if spins%softSpinYield == 0 {
			if stop.Load() {
				return 0, errSoftStopped
			}
			runtime.Gosched()
		}
	}
	c := h.wc[0]
	if c.Status != verbs.WCSuccess {
		return 0, fmt.Errorf("receive: %+v", c)
	}
	copy(h.app, h.e.Ring.Bytes()[:c.ByteLen])
	h.repost[0].ID = c.WRID
	if err := h.e.QP.PostRecv(h.repost); err != nil {
		return 0, fmt.Errorf("repost: %w", err)
	}
	return c.Imm, nil
}

// ReapSignaled polls, into wc, the one signaled send completion that frees the last
// batch's slots.
func ReapSignaled(cq verbs.CQ, wc []verbs.WorkCompletion) error {
	for {
		n, err := cq.Poll(wc[:1])
		if err != nil || (n == 1 && wc[0].Status != verbs.WCSuccess) {
			return fmt.Errorf("send completion: %v %+v", err, wc[0])
		}
		if n == 1 {
			return nil
		}
	}
}
