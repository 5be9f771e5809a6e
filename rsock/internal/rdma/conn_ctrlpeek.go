package rdma

import (
	"sync"
	"syscall"
)

// A Close that follows the peer's (the peer's FIN arrived first: the side that
// answers a client's close, a server's handler that read io.EOF) sends its own FIN
// toward a QP that is most likely torn down already, so its drain ends only when the
// control channel's end says the peer is gone. The control reader learns of that end
// through the netpoller: a park and a wake-up, on a loaded host 100–150 µs during which
// the drain spins and then sleeps. So such a drain also looks at the control socket
// itself, without reading it: a peek that finds its end (and no keepalive before it)
// is the same news, sooner. The control reader, which holds the socket's read side,
// is not disturbed: the peek takes nothing off the socket.

// ctrlPeekEvery spaces a draining Close's peeks while it spins: one every so many
// polls, and one as it is about to park. Each peek is a system call.
const ctrlPeekEvery = 16

// ctrlPeek is a Conn's access to its control socket for the peek. The socket's handle
// is the handshake's when it handed one over (UseControlSocket), else made on the first
// peek.
type ctrlPeek struct {
	raw    syscall.RawConn // nil: the control channel has no socket (QUIC, net.Pipe)
	looked bool            // raw is settled: handed over, or looked for
	ended  bool            // what the last peek found
}

// peekers holds the callbacks that peeks hand to RawConn.Control. A callback is a
// method value, and a method value is an allocation: a Conn peeks only in its Close, so
// one per Conn would cost every connection one, where the pool's are reused.
var peekers = sync.Pool{New: func() any {
	p := new(peeker)
	p.look = p.lookAt
	return p
}}

// peeker is one peek's callback and what it found.
type peeker struct {
	look  func(fd uintptr)
	ended bool
}

// UseControlSocket gives the Conn the handle of its control channel's socket, which
// the handshake made already for its own polling reads: Close's peek (see above)
// then makes none of its own. It is called before Start, by the goroutine that set
// the Conn up.
func (c *Conn) UseControlSocket(raw syscall.RawConn) {
	c.peek.raw, c.peek.looked = raw, raw != nil
}

// controlEnded reports whether the peer closed the control channel and nothing but that
// end is left on it: the peer is gone (see above). A control channel without a socket
// never says so here; its reader says it as before.
func (c *Conn) controlEnded() bool {
	p := &c.peek
	if !p.looked {
		p.looked = true
		if sc, ok := c.ctrl.(syscall.Conn); ok {
			p.raw, _ = sc.SyscallConn() // nil on error: no peeking
		}
	}
	if p.raw == nil {
		return false
	}
	pk := peekers.Get().(*peeker)
	pk.ended = false
	err := p.raw.Control(pk.look)
	p.ended = err == nil && pk.ended
	peekers.Put(pk)
	return p.ended
}

// lookAt peeks at socket fd without waiting: a read of 0 bytes without an error is
// the peer's orderly close with nothing before it. Keepalive bytes still unread, or
// nothing at all yet, are not an end.
func (p *peeker) lookAt(fd uintptr) {
	var b [1]byte
	n, err := recvPeek(fd, b[:])
	p.ended = err == nil && n == 0
}

// recvPeek reads what socket fd has into b without taking it off the socket and
// without waiting: syscall.EAGAIN when it has nothing yet.
func recvPeek(fd uintptr, b []byte) (int, error) {
	n, _, err := syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return n, err
}
