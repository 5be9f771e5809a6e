package shm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// Connections: a requester QP dials the abstract Unix socket (SOCK_SEQPACKET) of its
// destination QP, checks that the listener runs as an allowed user, and says hello,
// passing the connection's channel (channel.go). From then on its requests go through
// the channel, pipelined, and a goroutine of the requester's reads the responses. On
// the responder's side the QP's accept loop checks the dialer's user (SO_PEERCRED) and
// serves the connection on a goroutine of its own. Polling a CQ drains the rings that
// feed it too (drive.go); the goroutines drain what no poller does and sleep in the
// netpoller on the socket until a doorbell or a datagram comes: no thread waits in a
// system call. The socket also tells each side of the other's death: it closes with the
// process.

// peerConn is a requester QP's connection to its destination QP, its channel and the
// regions of the destination it has mapped. Everything but dead, mu and what mu guards
// is guarded by the QP's sq.mu.
type peerConn struct {
	c       *net.UnixConn
	q       *QP
	dead    atomic.Bool // the connection failed or was closed
	regions map[uint32]*peerRegion
	once    sync.Once

	ch   *channel
	req  ring // the request ring, produced here
	bell bell
	skip int // responses still to come for requests abandoned by a rewind

	// readLoop's lease while Polls drain the response ring (drive.go): wake ends it,
	// and querying (a region query awaits its answer on the socket) forbids it.
	wake     chan struct{}
	querying atomic.Bool
	// stalled says the requester holds WRs it cannot publish before the answers to
	// those in flight come (setStalled), plain acknowledgements among them, which wake
	// no sleeping reader: readLoop then sleeps with a deadline, not until a doorbell.
	stalled atomic.Bool

	// mu guards the consumption of the response ring, by readLoop or a Poll of the send
	// CQ (drive.go), and the mapping: readLoop unmaps it, last, under mu.
	mu       sync.Mutex
	resp     ring
	buf      [responseLen]byte
	unmapped bool
}

// peerRegion is a region of the destination QP mapped here.
type peerRegion struct {
	addr     uint64
	mem      []byte
	writable bool // mapped writable and granting remote write
	readable bool // granting remote read
}

// slice returns the bytes [addr, addr+n) of the region, or false if they are not all
// inside it.
func (r *peerRegion) slice(addr uint64, n uint32) ([]byte, bool) {
	if r == nil {
		return nil, false
	}
	return rc.Slice(r.mem, r.addr, addr, n)
}

// dialPeer connects q to its destination QP and says hello, passing a new channel. The
// caller holds q.sq.mu.
func dialPeer(q *QP) (*peerConn, error) {
	if err := q.dev.p.injectedFailure(allocDial); err != nil {
		return nil, fmt.Errorf("shm: dial QP %#x: %w", q.sq.destQPN, err)
	}
	addr := &net.UnixAddr{Name: qpSocketName(q.sq.destQPN), Net: "unixpacket"}
	c, err := net.DialUnix("unixpacket", nil, addr)
	if err != nil {
		return nil, fmt.Errorf("shm: dial QP %#x: %w", q.sq.destQPN, err)
	}
	if err := checkPeer(c, q.dev.p.allow); err != nil {
		c.Close()
		return nil, err
	}
	fd, ch, err := newChannelMemory(&q.maps)
	if err != nil {
		c.Close()
		return nil, err
	}
	defer unix.Close(fd)
	b, err := newBell(c)
	if err != nil {
		ch.unmap()
		c.Close()
		return nil, err
	}
	pc := &peerConn{c: c, q: q, regions: map[uint32]*peerRegion{}, ch: ch,
		req: ch.requestRing(), resp: ch.responseRing(), bell: b, wake: make(chan struct{}, 1)}
	hello := msg{kind: msgHello, srcQPN: q.qpn, dstQPN: q.sq.destQPN, srcGID: q.sq.sgid}
	if err := pc.send(hello.encode(make([]byte, 0, helloLen)), fd); err != nil {
		ch.unmap()
		c.Close()
		return nil, err
	}
	go pc.readLoop()
	return pc, nil
}

// push publishes a record in the request ring and rings the responder's doorbell if it
// sleeps. It reports false if the ring is full.
func (pc *peerConn) push(rec []byte) (bool, error) {
	if rec[0] == msgMRQuery {
		pc.expectRegion()
	}
	ok, wake, err := pc.req.push(rec, true)
	if wake {
		pc.bell.ring()
	}
	return ok, err
}

// bell rings a peer's doorbell on a connection's socket.
type bell struct {
	raw syscall.RawConn
	fn  func(fd uintptr) // made once: a closure per ring would allocate
}

func newBell(c *net.UnixConn) (bell, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return bell{}, fmt.Errorf("shm: raw connection: %w", err)
	}
	return bell{raw: raw, fn: func(fd uintptr) { ringDoorbell(int(fd)) }}, nil
}

func (b bell) ring() { b.raw.Control(b.fn) }

// send writes one datagram, passing fd with it unless fd is negative.
func (pc *peerConn) send(b []byte, fd int) error {
	return sendMsg(pc.c, b, fd)
}

func sendMsg(c *net.UnixConn, b []byte, fd int) error {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("shm: send: %w", err)
	}
	return nil
}

// region returns the mapped region of the destination whose key is rkey, or nil.
func (pc *peerConn) region(rkey uint32) *peerRegion { return pc.regions[rkey] }

// addRegion maps the region m describes from descriptor fd, which it consumes, in place
// of any region mapped before (mapquota.go): a WR that names an older one again asks for
// it again.
func (pc *peerConn) addRegion(m *msg, fd int) error {
	pc.forgetRegions()
	if err := pc.q.dev.p.injectedFailure(allocRegion); err != nil {
		closeFD(fd)
		return fmt.Errorf("shm: map peer region: %w", err)
	}
	mem, writable, err := mapPeerRegion(fd, m.size, &pc.q.maps)
	if err != nil {
		return err
	}
	pc.regions[m.rkey] = &peerRegion{addr: m.addr, mem: mem, writable: writable && m.access&uint32(verbs.AccessRemoteWrite) != 0,
		readable: m.access&uint32(verbs.AccessRemoteRead) != 0}
	return nil
}

// setStalled records whether the requester waits for the answers to its requests in
// flight before it can publish more: a WR behind them needs an empty pipeline (a region
// query, a local error's completion, a fence) or room (maxInflight). A responder rings
// the doorbell of a sleeping reader only for the responses it was asked to (a
// signaled WR, a pipeline filling up) or that are not plain acknowledgements, so that a
// stream of unsignaled writes costs no system call per request; but a requester that
// stalls behind unsignaled writes would wait for their acknowledgements forever, once
// nothing else drains the response ring: no Poll of the send CQ (armed, or a CQ of more
// than maxDriven QPs) and readLoop asleep on the socket. On the stall's start, setStalled
// ends readLoop's lease and its sleep (a read deadline in the past), and until the stall
// ends readLoop, unless Polls drive the ring, watches it a moment and then sleeps with a
// deadline (readLoop). The caller holds the QP's sq.mu.
func (pc *peerConn) setStalled(stalled bool) {
	if pc.stalled.Load() == stalled {
		return
	}
	pc.stalled.Store(stalled)
	if stalled {
		pc.endLease()
		pc.c.SetReadDeadline(time.Now())
	}
}

// maxStallWait bounds a stalled readLoop's sleep between looks at its response ring.
const maxStallWait = 64 * time.Millisecond

// fail ends the connection because the peer broke the protocol.
func (pc *peerConn) fail(error) {
	pc.dead.Store(true)
	pc.c.Close()
	pc.endLease()
}

// forgetRegions unmaps the regions, to be asked for again.
func (pc *peerConn) forgetRegions() {
	for k, r := range pc.regions {
		unmap(r.mem, &pc.q.maps)
		delete(pc.regions, k)
	}
}

// close ends the connection and unmaps the regions. The caller holds the QP's sq.mu.
func (pc *peerConn) close() {
	pc.once.Do(func() {
		pc.dead.Store(true)
		pc.c.Close()
		pc.endLease()
		pc.forgetRegions()
	})
}

// readLoop reads the responses of the destination QP from the channel, when no Poll
// does, and regions and doorbells from the socket, until the connection ends; then it
// unmaps the channel. While its send CQ is being polled, and not armed, and no region
// query awaits its answer, it leaves the response ring to the polls for a lease, as
// serve does its request ring (drive.go), without saying it sleeps: the responder then
// rings no doorbell for the responses a requester asks to have at once. Otherwise it
// says when it sleeps, and blocks on the socket.
func (pc *peerConn) readLoop() {
	r, err := newMsgReader(pc.c, regionLen+1, unix.CmsgSpace(4*4))
	watch := pollWatch{cq: pc.q.sendCQ}
	lease := time.NewTimer(pollLease)
	defer lease.Stop()
	spun, stallWait := false, pollLease // this stall's spin, and its next sleep
	for err == nil && !pc.dead.Load() {
		pc.mu.Lock()
		var got int
		got, err = pc.drainLocked()
		sleep, leased, stalled, pos := false, false, false, pc.resp.pos
		if err == nil && got == 0 {
			if leased = pc.leasable(&watch); !leased {
				stalled = pc.stalled.Load() && !pc.querying.Load()
				atomic.StoreUint32(pc.resp.sleep, 1)
				if sleep = !pc.resp.pending(); !sleep { // published before the word was seen
					atomic.StoreUint32(pc.resp.sleep, 0)
				}
			}
		}
		pc.mu.Unlock()
		if got > 0 || !stalled {
			spun, stallWait = false, pollLease
		}
		if err != nil {
			continue
		}
		if leased {
			pc.waitLease(lease)
			continue
		}
		if !sleep {
			continue
		}
		if stalled {
			// Plain acknowledgements ring no doorbell: watch the ring a moment, once a
			// stall, then sleep for stallWait at most, from pollLease doubling to
			// maxStallWait (a peer that lives but does not answer costs a wake-up now and
			// then), reading the socket still, where the peer's death shows.
			if !spun {
				spun = true
				if spinArmed(pc.resp.prod, pos) { // readLoop owns the mapping: no lock needed
					atomic.StoreUint32(pc.resp.sleep, 0)
					continue
				}
			}
			if err = pc.c.SetReadDeadline(time.Now().Add(stallWait)); err != nil {
				break
			}
			stallWait = min(2*stallWait, maxStallWait)
		}
		var n, oobn, flags int
		n, oobn, flags, err = r.read()
		atomic.StoreUint32(pc.resp.sleep, 0)
		if errors.Is(err, os.ErrDeadlineExceeded) { // a stall's sleep ended, or setStalled ended one
			err = pc.c.SetReadDeadline(time.Time{})
			continue
		}
		if err != nil {
			break
		}
		fd := -1
		if oobn > 0 {
			fds := parseFDs(r.oob[:oobn])
			if len(fds) != 1 {
				closeFDs(fds)
				break
			}
			fd = fds[0]
		}
		var m msg
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || m.decode(r.buf[:n]) != nil ||
			(m.kind != msgRegion && fd >= 0) {
			closeFD(fd)
			break
		}
		switch m.kind {
		case msgDoorbell:
		case msgRegion:
			pc.querying.Store(false)
			pc.q.onRegion(pc, &m, fd)
		default:
			err = errMalformed
		}
	}
	pc.dead.Store(true)
	pc.c.Close()
	pc.q.onConnDown(pc) // after it, the requester pushes nothing more
	pc.q.out.CompareAndSwap(pc, nil)
	pc.q.sendCQ.awaitPeeks() // no Poll of the send CQ looks into the ring any more
	pc.mu.Lock()
	pc.unmapped = true
	pc.ch.unmap()
	pc.mu.Unlock()
}

// parseFDs returns the descriptors an SCM_RIGHTS control message carried.
func parseFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

var errPeerUser = errors.New("shm: peer runs as a user that is not allowed")

// checkPeer requires the process at the other end of c to run as an allowed user.
func checkPeer(c *net.UnixConn, allow map[uint32]bool) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("shm: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return fmt.Errorf("shm: peer credentials: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("shm: peer credentials: %w", cerr)
	}
	if !allow[cred.Uid] {
		return fmt.Errorf("%w: uid %d (pid %d)", errPeerUser, cred.Uid, cred.Pid)
	}
	return nil
}

// acceptLoop accepts requesters' connections to q until its socket closes.
//
// An accept that fails while the socket is open (the process out of file descriptors,
// EMFILE, or the host out of memory) is retried after a pause, doubling from
// acceptRetryMin to acceptRetryMax, as net/http's Server does. Returning instead left
// the socket listening with nobody accepting: a peer's connection waited in the
// backlog, its requests unanswered, for as long as the QP lived.
func (q *QP) acceptLoop() {
	p := q.dev.p
	defer p.wg.Done()
	var pause time.Duration
	for {
		c, err := q.ln.AcceptUnix()
		if err == nil {
			if err = p.injectedFailure(allocAccept); err != nil {
				c.Close()
			}
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, acceptRetryMin), acceptRetryMax)
			t := time.NewTimer(pause)
			select {
			case <-q.ln.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		pause = 0
		if checkPeer(c, p.allow) != nil {
			c.Close()
			continue
		}
		if !q.ln.adopt(c) { // the QP closed
			c.Close()
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			q.ln.release(c)
			c.Close()
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go q.serve(c)
	}
}

// serve answers one requester's connection: a hello naming q with the connection's
// channel, then requests and region queries in the channel's request ring, and
// doorbells on the socket. Anything that breaks the protocol (a malformed, truncated or
// unexpected datagram or record, a descriptor where none belongs, an impossible cursor,
// a response ring the requester let fill) ends the connection, which the requester sees
// as a dead link.
func (q *QP) serve(c *net.UnixConn) {
	p := q.dev.p
	defer p.wg.Done()
	defer func() {
		c.Close()
		q.ln.release(c)
	}()
	r, err := newMsgReader(c, helloLen+1, unix.CmsgSpace(4*8))
	if err != nil {
		return
	}
	n, oobn, flags, err := r.read()
	if err != nil {
		return
	}
	fds := parseFDs(r.oob[:oobn])
	var m msg
	if len(fds) != 1 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || m.decode(r.buf[:n]) != nil ||
		m.kind != msgHello || m.dstQPN != q.qpn {
		closeFDs(fds)
		return
	}
	src := requester{gid: m.srcGID, qpn: m.srcQPN}
	ch, err := mapChannel(fds[0], &q.maps)
	if err != nil {
		return
	}
	b, err := newBell(c)
	if err != nil {
		ch.unmap()
		return
	}
	in := &inbound{q: q, c: c, src: src, bell: b, ch: ch, reqs: ch.requestRing(), resps: ch.responseRing(),
		buf: make([]byte, maxMsg), out: make([]byte, 0, regionLen), wake: make(chan struct{}, 1),
		reply: regionAnswer{b: make([]byte, 0, regionLen), fd: -1}}
	q.rq.mu.Lock()
	if q.rq.srcGID == src.gid && q.rq.srcQPN == src.qpn {
		q.in.Store(in) // the connection of the QP's peer: Poll drives it
	}
	q.rq.mu.Unlock()
	defer func() {
		q.in.CompareAndSwap(in, nil)
		q.recvCQ.awaitPeeks() // no Poll of the receive CQ looks into the ring any more
		in.mu.Lock()
		in.dead = true
		in.dropReply()
		in.mu.Unlock()
		ch.unmap()
	}()
	watch := pollWatch{cq: q.recvCQ}
	lease := time.NewTimer(pollLease)
	defer lease.Stop()
	spun := false // this idle spell was spun through already
	for {
		in.mu.Lock()
		got, err := 0, errClosedConn
		if !in.dead {
			got, err = in.drainLocked()
		}
		if reply := in.reply; err == nil && reply.waiting { // left by this drain or a Poll's
			in.mu.Unlock()
			if in.sendReply(reply) != nil {
				return
			}
			spun = false
			continue
		}
		leased, sleep, pos := false, false, in.reqs.pos
		if err == nil && got == 0 {
			if leased = watch.active() && q.in.Load() == in; !leased && spun {
				atomic.StoreUint32(in.reqs.sleep, 1)
				if sleep = !in.reqs.pending(); !sleep {
					atomic.StoreUint32(in.reqs.sleep, 0)
				}
			}
		}
		in.mu.Unlock()
		switch {
		case err != nil:
			return
		case got > 0:
			spun = false
			continue
		case leased:
			// Polls drain the ring: look again after the lease, to take over if they
			// stopped without arming the CQ, or when they arm it.
			lease.Reset(pollLease)
			select {
			case <-lease.C:
			case <-in.wake:
				lease.Stop()
			}
			continue
		case !spun:
			// Poll the ring a moment before saying this side sleeps, which would make
			// the requester ring.
			spun = !spinArmed(in.reqs.prod, pos) // serve owns the mapping: no lock needed
			continue
		case !sleep:
			continue
		}
		spun = false
		n, oobn, flags, err := r.read()
		atomic.StoreUint32(in.reqs.sleep, 0)
		if err != nil || oobn > 0 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 ||
			m.decode(r.buf[:n]) != nil || m.kind != msgDoorbell {
			closeFDs(parseFDs(r.oob[:oobn]))
			return
		}
	}
}

var errClosedConn = errors.New("shm: connection closed")

// How long acceptLoop pauses after a failed accept: from acceptRetryMin, doubling, to
// acceptRetryMax.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)
