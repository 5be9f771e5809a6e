package shm

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/internal/cpuyield"
)

// Who consumes the rings. A channel's request ring is consumed on the responder's side
// and its response ring on the requester's, each by two parties under one mutex: the
// connection's goroutine (serve, readLoop), and CQ.Poll, which drains the rings of the
// QPs that feed the CQ before it reaps, as a NIC's completions appear to a poller with
// no thread in between. A busy-polling application therefore moves requests and
// responses itself, with no wake-up and no system call; the goroutines cover the rest.
//
// While its CQ is being polled, and not armed, serve leaves the request ring to the
// polls and sleeps for a lease (pollLease) without saying so in the channel, so that
// the requester rings no doorbells the poller does not need; it looks again when the
// lease ends, or at once when the CQ is armed. Otherwise (the CQ is armed, or no longer
// polled) it polls the ring itself for a moment (armedSpin), then says it sleeps, looks
// once more, and blocks on the socket. Arming a CQ (ReqNotify) says so for every ring
// that feeds it, so that the next record rings the doorbell of a goroutine that then
// completes into the armed CQ and raises its event. readLoop does the same with the
// response ring while its send CQ is polled and no region query awaits its answer on
// the socket, and otherwise says it sleeps; responders ring its doorbell only for
// responses a requester asked to have at once (reqNotify, wire.go).
//
// Every empty Poll, after a short wait that drives the rings again (pollwait.go),
// yields the processor (yieldCPU, yield.go), or every eighth one on a
// host whose cores are contended: an application spinning on its CQ leaves the cores
// to the peer process, which fills it. A CQ fed by more than maxDriven QPs (one CQ
// serving many connections) is not driven: its rings go through the goroutines and
// doorbells only.

// pollLease is how long serve sleeps without a doorbell while its CQ is being polled.
const pollLease = time.Millisecond

// armedSpin is how long serve polls its ring, yielding, before it sleeps on the socket.
const armedSpin = 30 * time.Microsecond

// maxDriven bounds the QPs a CQ's Poll drives: a CQ fed by more leaves them to their
// goroutines rather than visit every one on every poll. Left to their goroutines, a
// request wakes its responder through a doorbell and the network poller unless the
// responder is still watching its ring (armedSpin): a connection whose requests come
// a round trip apart pays that on each. It was 64, and an rsock engine's CQ holds 127
// QPs (16,384 entries, 129 a QP; 224 at most, with 8 receive WQEs), so from 33
// connections with both ends in one process most exchanges paid it: 64 connections each making 2-byte round
// trips at once made 10.5 thousand a second in all against TCP's 92–100 thousand, and
// one connection among 60 idle ones 6.0 thousand. At 256 they made 167–173 thousand
// and 23 thousand (medians of three, 2026-12-01; benchmarks/README.md). At 256 an
// engine's CQs are always driven; each Poll visits up to 127 QPs by default, about
// 0.6 µs when they are idle (drive): that, not a doorbell, is what idle connections
// still cost a busy one.
const maxDriven = 256

// inbound is the responder's side of one connection: its channel and what executes
// the requests in it. mu guards everything but the fields set before it is shared.
type inbound struct {
	q    *QP
	c    *net.UnixConn
	src  requester
	bell bell
	wake chan struct{} // ends serve's lease: the CQ was armed

	mu    sync.Mutex
	dead  bool // the channel is unmapped or about to be: touch nothing
	ch    *channel
	reqs  ring
	resps ring
	buf   []byte // a request record, copied out of the ring
	out   []byte // a response being encoded
	m     msg
	reply regionAnswer // a region query's answer, made by drainLocked, that serve sends
}

// regionAnswer is an answer to a region query that waits to be sent on the socket, and the
// descriptor it passes (-1: none). Its bytes have their own buffer: drainLocked
// encodes responses into inbound.out while serve sends the answer.
type regionAnswer struct {
	waiting bool
	b       []byte
	fd      int
}

// maxDrainBatch bounds the records one drain takes from a ring. A drain runs under the
// ring's lock, which arming the CQ (announceSleep) and a Poll's drive take too, and the
// peer maps the channel and moves its cursors as it likes: one that kept its ring full
// would keep a single drain going, and the lock held, for as long as it flooded. The
// connection's goroutine (serve, readLoop) drains again at once after a full batch, and
// so does the next look of a Poll; a full pipeline (maxInflight records) takes a few.
const maxDrainBatch = 256

// drainLocked executes the requests in the request ring and answers each, at most
// maxDrainBatch, and up to and including the first region query: that answer travels on
// the socket, and a write to a socket blocks for as long as the requester leaves it
// unread. drainLocked runs in Polls of the receive CQ (drive) and under inbound.mu,
// which ReqNotify takes for every ring that feeds the CQ; a blocked write there would
// stall every connection of the CQ, for one requester that stopped reading. So
// drainLocked makes the answer and leaves it in reply, and the connection's goroutine
// sends it (serve, sendReply) without the lock; nothing more is drained until it has,
// so requests are executed and answered in order as before. An error ends the
// connection.
func (in *inbound) drainLocked() (int, error) {
	n := 0
	for n < maxDrainBatch && !in.reply.waiting {
		rec, err := in.reqs.pop(in.buf)
		if err != nil || rec == nil {
			return n, err
		}
		n++
		m := &in.m
		if err := m.decode(rec); err != nil {
			return n, err
		}
		switch m.kind {
		case msgRequest:
			resp := in.q.respond(in.src, m)
			ok, wake, err := in.resps.push(resp.encode(in.out), m.flags&reqNotify != 0 || resp.respKind != respAck)
			if err != nil {
				return n, err
			}
			if !ok {
				return n, errors.New("shm: the requester let the response ring fill")
			}
			if wake {
				in.bell.ring()
			}
		case msgMRQuery:
			reply, fd := in.q.regionFor(in.src, m.rkey)
			in.reply = regionAnswer{waiting: true, b: reply.encode(in.reply.b[:0]), fd: fd}
		default:
			return n, errMalformed
		}
	}
	return n, nil
}

// sendReply sends r, the region query's answer that drainLocked left in reply, without
// inbound.mu: it blocks for as long as the requester leaves its socket unread, and
// holds up no one but this connection meanwhile. Only serve calls it. Nothing else
// writes reply while it waits, so r's bytes are not overwritten during the send.
func (in *inbound) sendReply(r regionAnswer) error {
	err := sendMsg(in.c, r.b, r.fd)
	closeFD(r.fd)
	in.mu.Lock()
	in.reply.waiting, in.reply.fd = false, -1
	in.mu.Unlock()
	return err
}

// dropReply closes the descriptor of an answer that will not be sent: the connection
// ended.
func (in *inbound) dropReply() {
	if in.reply.waiting {
		closeFD(in.reply.fd)
		in.reply.waiting, in.reply.fd = false, -1
	}
}

// drive drains the request ring for a Poll of the QP's receive CQ, if no one else is.
func (in *inbound) drive() {
	if !in.mu.TryLock() {
		return
	}
	if !in.dead {
		if _, err := in.drainLocked(); err != nil {
			in.dead = true // serve finds the socket closed and unmaps
			in.c.Close()
		}
	}
	waiting := in.reply.waiting
	in.mu.Unlock()
	if waiting { // serve sends it
		in.endLease()
	}
}

// endLease ends serve's lease, if it has one: the CQ was armed, or a Poll left an
// answer for it to send.
func (in *inbound) endLease() {
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// announceSleep says, for an armed CQ, that the request ring's consumer sleeps.
func (in *inbound) announceSleep() {
	in.mu.Lock()
	if !in.dead {
		atomic.StoreUint32(in.reqs.sleep, 1)
	}
	in.mu.Unlock()
	in.endLease()
}

// drainLocked handles the responses in the response ring, at most maxDrainBatch. An
// error ends the connection.
func (pc *peerConn) drainLocked() (int, error) {
	n := 0
	for n < maxDrainBatch {
		rec, err := pc.resp.pop(pc.buf[:])
		if err != nil || rec == nil {
			return n, err
		}
		n++
		var m msg
		if m.decode(rec) != nil || m.kind != msgResponse {
			return n, errMalformed
		}
		pc.q.onResponse(pc, &m)
	}
	return n, nil
}

// drive drains the response ring for a Poll of the QP's send CQ, if no one else is.
func (pc *peerConn) drive() {
	if !pc.mu.TryLock() {
		return
	}
	if !pc.unmapped && !pc.dead.Load() {
		if _, err := pc.drainLocked(); err != nil {
			pc.fail(err) // readLoop finds the socket closed and unmaps
		}
	}
	pc.mu.Unlock()
}

// announceSleep says, for an armed CQ, that the response ring's consumer sleeps, and
// ends readLoop's lease.
func (pc *peerConn) announceSleep() {
	pc.mu.Lock()
	if !pc.unmapped {
		atomic.StoreUint32(pc.resp.sleep, 1)
	}
	pc.mu.Unlock()
	pc.endLease()
}

// leasable reports whether readLoop may leave the response ring to the Polls of its
// send CQ for a lease: they drive it (w), this is the QP's connection, and no region
// query awaits its answer, which comes on the socket that a leased readLoop does not
// read.
func (pc *peerConn) leasable(w *pollWatch) bool {
	return w.active() && pc.q.out.Load() == pc && !pc.querying.Load()
}

// waitLease sleeps for pollLease, or until endLease.
func (pc *peerConn) waitLease(t *time.Timer) {
	t.Reset(pollLease)
	select {
	case <-t.C:
	case <-pc.wake:
		t.Stop()
	}
}

// endLease ends readLoop's lease, if it has one: the CQ was armed, a region query
// went out, or the connection is ending.
func (pc *peerConn) endLease() {
	select {
	case pc.wake <- struct{}{}:
	default:
	}
}

// expectRegion says a region query goes out: readLoop reads the socket until its
// answer comes.
func (pc *peerConn) expectRegion() {
	pc.querying.Store(true)
	pc.endLease()
}

// feeders returns the QPs whose rings the CQ's Poll drives, or nil if there are too
// many.
func (c *CQ) feederList() []*QP {
	fs := c.feeders.Load()
	if fs == nil || len(*fs) > maxDriven {
		return nil
	}
	return *fs
}

// PollDrives reports whether a Poll of c drains the rings that feed it now: false once
// more than maxDriven QPs feed it. Then only their goroutines (serve, readLoop) do,
// woken through the network poller by the peers' doorbells, and a caller that spins on
// c keeps a processor from them rather than helping (see rsock's engine, which looks
// for it).
func (c *CQ) PollDrives() bool {
	fs := c.feeders.Load()
	return fs == nil || len(*fs) <= maxDriven
}

// drive drains the rings that feed c: the request rings of the QPs whose receive CQ it
// is, and the response rings of those whose send CQ it is.
//
// It looks into each ring before it takes the ring's lock, and passes by a ring with
// nothing published: on a CQ that many connections feed, most rings are empty at any
// moment, and taking and releasing each one's lock was most of a Poll's cost: a pass
// over 127 idle QPs took 1.9–2.3 µs, and takes 0.61–0.66 µs looking first
// (BenchmarkDriveIdle). Looking reads the mapping without the lock that keeps it
// mapped, so the pass holds peekMu for reading, and a ring is unmapped only after it
// can no longer be reached from the feeders and peekMu was taken for writing once
// (awaitPeeks): no pass still looks into it. While an unmapping waits for that, Polls
// take each ring's lock first, as before, rather than wait.
func (c *CQ) drive() {
	fs := c.feederList()
	if len(fs) == 0 {
		return
	}
	look := c.peekMu.TryRLock()
	for _, q := range fs {
		if q.recvCQ == c {
			if in := q.in.Load(); in != nil && (!look || in.reqs.published()) {
				in.drive()
			}
		}
		if q.sendCQ == c {
			if pc := q.out.Load(); pc != nil && (!look || pc.resp.published()) {
				pc.drive()
			}
		}
	}
	if look {
		c.peekMu.RUnlock()
	}
}

// awaitPeeks returns once no Poll of c looks into a ring it reached before the caller
// made that ring unreachable (drive): the caller may then unmap it.
func (c *CQ) awaitPeeks() {
	c.peekMu.Lock()
	//lint:ignore SA2001 the empty critical section is the point: a barrier
	c.peekMu.Unlock()
}

// announceSleep says, for every ring that feeds c, that its consumer sleeps.
func (c *CQ) announceSleep() {
	fs := c.feeders.Load()
	if fs == nil {
		return
	}
	for _, q := range *fs {
		if q.recvCQ == c {
			if in := q.in.Load(); in != nil {
				in.announceSleep()
			}
		}
		if q.sendCQ == c {
			if pc := q.out.Load(); pc != nil {
				pc.announceSleep()
			}
		}
	}
}

// addFeeder and removeFeeder keep the list of QPs that feed c, copied on write.
func (c *CQ) addFeeder(q *QP) {
	c.feedMu.Lock()
	defer c.feedMu.Unlock()
	var fs []*QP
	if old := c.feeders.Load(); old != nil {
		fs = append(fs, *old...)
	}
	fs = append(fs, q)
	c.feeders.Store(&fs)
}

func (c *CQ) removeFeeder(q *QP) {
	c.feedMu.Lock()
	defer c.feedMu.Unlock()
	old := c.feeders.Load()
	if old == nil {
		return
	}
	fs := make([]*QP, 0, len(*old))
	for _, f := range *old {
		if f != q {
			fs = append(fs, f)
		}
	}
	c.feeders.Store(&fs)
}

// pollWatch tells serve whether its CQ is being polled: polled since the last look, not
// armed, and driving its feeders.
type pollWatch struct {
	cq   *CQ
	seen uint64
}

func (w *pollWatch) active() bool {
	n := w.cq.polls.Load()
	was := w.seen
	w.seen = n
	return n != was && !w.cq.core.Armed() && w.cq.feederList() != nil
}

// spinArmed watches the producer cursor prod of a ring for up to armedSpin, yielding
// the processor between looks, before serve sleeps for want of requests; it reports
// whether the cursor moved from pos. A request/response exchange whose next request
// comes within it costs no doorbell and no wake-up of this goroutine. It yields at
// every look whatever the host (cpuyield.SchedYield, not yieldCPU's policy): it is
// bounded in time, not in looks, and no Gosched stands between them.
func spinArmed(prod *uint64, pos uint64) bool {
	start := time.Now()
	for i := 1; ; i++ {
		if atomic.LoadUint64(prod) != pos {
			return true
		}
		if i%16 == 0 && time.Since(start) > armedSpin {
			return false
		}
		cpuyield.SchedYield()
	}
}
