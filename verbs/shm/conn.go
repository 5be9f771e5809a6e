package shm

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
)

// Connections: a requester QP dials the abstract Unix socket (SOCK_SEQPACKET) of its
// destination QP, checks that the listener runs as an allowed user, says hello, and
// from then on sends one request or region query at a time; a goroutine of the
// requester's reads the answers. On the responder's side the QP's accept loop checks
// the dialer's user (SO_PEERCRED) and serves the connection on a goroutine of its own.
// Both goroutines park in the netpoller while nothing arrives: the datagram is the
// doorbell, and no thread waits in a system call.

// peerConn is a requester QP's connection to its destination QP, and the regions of
// the destination it has mapped. Everything but dead is guarded by the QP's sq.mu.
type peerConn struct {
	c       *net.UnixConn
	q       *QP
	dead    atomic.Bool // the connection failed or was closed
	regions map[uint32]*peerRegion
	once    sync.Once
}

// peerRegion is a region of the destination QP mapped here.
type peerRegion struct {
	addr     uint64
	mem      []byte
	writable bool
}

// slice returns the bytes [addr, addr+n) of the region, or false if they are not all
// inside it.
func (r *peerRegion) slice(addr uint64, n uint32) ([]byte, bool) {
	if addr < r.addr {
		return nil, false
	}
	off := addr - r.addr
	if off > uint64(len(r.mem)) || uint64(n) > uint64(len(r.mem))-off {
		return nil, false
	}
	return r.mem[off : off+uint64(n) : off+uint64(n)], true
}

// dialPeer connects q to its destination QP and says hello. The caller holds q.sq.mu.
func dialPeer(q *QP) (*peerConn, error) {
	addr := &net.UnixAddr{Name: qpSocketName(q.sq.destQPN), Net: "unixpacket"}
	c, err := net.DialUnix("unixpacket", nil, addr)
	if err != nil {
		return nil, fmt.Errorf("shm: dial QP %#x: %w", q.sq.destQPN, err)
	}
	if err := checkPeer(c, q.dev.p.allow); err != nil {
		c.Close()
		return nil, err
	}
	pc := &peerConn{c: c, q: q, regions: map[uint32]*peerRegion{}}
	hello := msg{kind: msgHello, srcQPN: q.qpn, dstQPN: q.sq.destQPN, srcGID: q.sq.sgid}
	if err := pc.send(hello.encode(make([]byte, 0, helloLen)), -1); err != nil {
		c.Close()
		return nil, err
	}
	go pc.readLoop()
	return pc, nil
}

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

// addRegion maps the region m describes from descriptor fd, which it consumes.
func (pc *peerConn) addRegion(m *msg, fd int) error {
	mem, writable, err := mapPeerRegion(fd, m.size)
	if err != nil {
		return err
	}
	if old := pc.regions[m.rkey]; old != nil {
		unmap(old.mem)
	}
	pc.regions[m.rkey] = &peerRegion{addr: m.addr, mem: mem, writable: writable && m.access&uint32(verbs.AccessRemoteWrite) != 0}
	return nil
}

// fail ends the connection because the peer broke the protocol.
func (pc *peerConn) fail(error) {
	pc.dead.Store(true)
	pc.c.Close()
}

// forgetRegions unmaps the regions, to be asked for again.
func (pc *peerConn) forgetRegions() {
	for k, r := range pc.regions {
		unmap(r.mem)
		delete(pc.regions, k)
	}
}

// close ends the connection and unmaps the regions. The caller holds the QP's sq.mu.
func (pc *peerConn) close() {
	pc.once.Do(func() {
		pc.dead.Store(true)
		pc.c.Close()
		pc.forgetRegions()
	})
}

func unmap(mem []byte) {
	if cap(mem) > 0 {
		unix.Munmap(mem[:cap(mem)])
	}
}

// readLoop reads the answers of the destination QP until the connection ends.
func (pc *peerConn) readLoop() {
	r, err := newMsgReader(pc.c, regionLen+1, unix.CmsgSpace(4*4))
	for err == nil {
		var n, oobn, flags int
		n, oobn, flags, err = r.read()
		if err != nil {
			break
		}
		buf, oob := r.buf, r.oob
		fd := -1
		if oobn > 0 {
			fds := parseFDs(oob[:oobn])
			if len(fds) != 1 {
				closeFDs(fds)
				break
			}
			fd = fds[0]
		}
		var m msg
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || m.decode(buf[:n]) != nil ||
			(m.kind != msgRegion && fd >= 0) {
			closeFD(fd)
			break
		}
		switch m.kind {
		case msgResponse:
			pc.q.onResponse(pc, &m)
		case msgRegion:
			pc.q.onRegion(pc, &m, fd)
		default:
			closeFD(fd)
			pc.dead.Store(true)
			pc.c.Close()
			pc.q.onConnDown(pc)
			return
		}
	}
	pc.dead.Store(true)
	pc.c.Close()
	pc.q.onConnDown(pc)
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
func (q *QP) acceptLoop() {
	p := q.dev.p
	defer p.wg.Done()
	for {
		c, err := q.ln.AcceptUnix()
		if err != nil {
			return
		}
		if checkPeer(c, p.allow) != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.closers[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go q.serve(c)
	}
}

// serve answers one requester's connection: a hello naming q, then requests and region
// queries. A datagram that breaks the protocol (malformed, truncated, carrying
// descriptors) ends the connection, which the requester sees as a dead link.
func (q *QP) serve(c *net.UnixConn) {
	p := q.dev.p
	defer p.wg.Done()
	defer func() {
		c.Close()
		p.untrack(c)
	}()
	r, err := newMsgReader(c, maxMsg+1, unix.CmsgSpace(4*8))
	if err != nil {
		return
	}
	buf, oob := r.buf, r.oob
	out := make([]byte, 0, regionLen)
	var src requester
	for said := false; ; said = true {
		n, oobn, flags, err := r.read()
		if err != nil {
			return
		}
		if oobn > 0 { // requesters pass no descriptors
			closeFDs(parseFDs(oob[:oobn]))
			return
		}
		var m msg
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || m.decode(buf[:n]) != nil {
			return
		}
		if !said {
			if m.kind != msgHello || m.dstQPN != q.qpn {
				return
			}
			src = requester{gid: m.srcGID, qpn: m.srcQPN}
			continue
		}
		switch m.kind {
		case msgRequest:
			resp := q.respond(src, &m)
			if sendMsg(c, resp.encode(out), -1) != nil {
				return
			}
		case msgMRQuery:
			reply, fd := q.regionFor(src, m.rkey)
			err := sendMsg(c, reply.encode(out), fd)
			closeFD(fd)
			if err != nil {
				return
			}
		default:
			return
		}
	}
}
