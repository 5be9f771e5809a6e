package shm

import (
	"fmt"
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// msgReader reads the datagrams of one connection without allocating, which
// net.UnixConn.ReadMsgUnix does not manage (it builds the sender's address each time):
// recvmsg without an address, through the connection's netpoller-driven RawConn.
type msgReader struct {
	raw   syscall.RawConn
	buf   []byte
	oob   []byte
	n     int
	oobn  int
	flags int
	err   error
	fn    func(fd uintptr) bool // made once: a closure per read would allocate
}

func newMsgReader(c *net.UnixConn, bufLen, oobLen int) (*msgReader, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("shm: raw connection: %w", err)
	}
	r := &msgReader{raw: raw, buf: make([]byte, bufLen), oob: make([]byte, oobLen)}
	r.fn = func(fd uintptr) bool {
		r.n, r.oobn, r.flags, r.err = recvmsg(int(fd), r.buf, r.oob)
		return r.err != unix.EAGAIN
	}
	return r, nil
}

// read receives one datagram into r.buf and its control data into r.oob. A closed
// connection, or a peer that closed its end, is io.EOF or the connection's error.
func (r *msgReader) read() (n, oobn, flags int, err error) {
	if err := r.raw.Read(r.fn); err != nil {
		return 0, 0, 0, err
	}
	if r.err != nil {
		return 0, 0, 0, r.err
	}
	if r.n == 0 && r.oobn == 0 { // no datagram is empty: the peer closed
		return 0, 0, 0, io.EOF
	}
	return r.n, r.oobn, r.flags, nil
}

// recvmsg is recvmsg(2) into p and oob, without the sender's address; descriptors
// received are close-on-exec.
func recvmsg(fd int, p, oob []byte) (n, oobn, flags int, err error) {
	var iov unix.Iovec
	iov.Base = unsafe.SliceData(p)
	iov.SetLen(len(p))
	msg := unix.Msghdr{Iov: &iov, Iovlen: 1}
	if len(oob) > 0 {
		msg.Control = unsafe.SliceData(oob)
		msg.SetControllen(len(oob))
	}
	r, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), unix.MSG_CMSG_CLOEXEC)
	if e != 0 {
		return 0, 0, 0, e
	}
	return int(r), int(msg.Controllen), int(msg.Flags), nil
}
