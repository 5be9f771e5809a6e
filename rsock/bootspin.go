package rsock

import (
	"errors"
	"io"
	"runtime"
	"sync"
	"syscall"

	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// The handshake's short waits on the bootstrap connection. Setting up an RDMA
// connection waits on the bootstrap connection twice where a plain TCP connection does
// not: the client for the server's accept, the server for the client's confirmation.
// Each answer comes within tens of microseconds, but a goroutine that parks for it is
// woken through the netpoller, and by then its thread has gone idle (on a virtual
// machine, its CPU halted): the wake-up, not the peer, is most of the wait. So, as a
// waiting Read on RDMA polls its completion queue before it parks (the engine's
// conn_poll.go), these waits first try the socket without blocking, a bounded number
// of times (Config.PollSpin), yielding the processor between empty tries; only then
// do they block in the ordinary Read. The bytes read are the same either way.

// bootSpin is an io.Reader over a bootstrap connection whose Reads first poll the
// socket: see above. A connection that exposes no socket (QUIC's streams), or a spin
// of 0, reads as the connection itself does.
type bootSpin struct {
	conn  bootConn
	raw   syscall.RawConn // nil: no polling; the engine's Conn peeks with it too (UseControlSocket)
	spins int             // non-blocking tries per Read before it blocks

	// hits counts the Reads that the polling served, for tests.
	hits int
}

// bootTries holds the callbacks that a polling Read hands to RawConn.Read, each with
// the outcome of its try. A callback is a method value, and a method value is an
// allocation: a handshake polls for a Read or two, so one per bootSpin would cost every
// connection one, where the pool's are reused.
var bootTries = sync.Pool{New: func() any {
	t := new(bootTry)
	t.read = t.tryRead
	return t
}}

// bootTry is one polling Read's callback: its buffer and the last try's outcome.
type bootTry struct {
	read  func(fd uintptr) bool
	buf   []byte
	n     int
	again bool // the socket had nothing to read yet
}

// init makes s read conn, polling it up to spins times per Read (PollSpin's
// meaning: 0 is the engine's default, negative never polls).
func (s *bootSpin) init(conn bootConn, spins int) {
	*s = bootSpin{conn: conn, spins: spinsOf(spins)}
	if s.spins == 0 {
		return
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	s.raw = raw
}

// spinsOf is the number of tries that a Config's PollSpin gives.
func spinsOf(pollSpin int) int {
	switch {
	case pollSpin < 0:
		return 0
	case pollSpin == 0:
		return rdma.DefaultPollSpin
	}
	return pollSpin
}

// tryRead is one non-blocking read of the socket fd into t.buf. It never asks the
// netpoller to wait (it reports done whatever happened): Read decides what follows.
func (t *bootTry) tryRead(fd uintptr) bool {
	n, err := syscall.Read(int(fd), t.buf)
	t.n, t.again = max(n, 0), errors.Is(err, syscall.EAGAIN)
	if err == nil && n == 0 {
		t.again = false // end of stream: the connection's own Read reports it
	}
	return true
}

// Read reads into b what the connection has, polling for it before it blocks. An end
// of stream, an error or a deadline that has passed ends the polling at once, and the
// connection's own Read returns them as it always does.
func (s *bootSpin) Read(b []byte) (int, error) {
	if s.raw != nil && len(b) > 0 {
		t := bootTries.Get().(*bootTry)
		n := s.poll(t, b)
		t.buf = nil
		bootTries.Put(t)
		if n > 0 {
			s.hits++
			return n, nil
		}
	}
	return s.conn.Read(b)
}

// poll tries to read into b up to s.spins times, yielding the processor between
// tries, and returns what it read: 0 when the socket had nothing, ended or failed, or
// the deadline passed.
func (s *bootSpin) poll(t *bootTry, b []byte) int {
	t.buf = b
	for i := range s.spins {
		if i > 0 {
			runtime.Gosched()
		}
		if err := s.raw.Read(t.read); err != nil || (t.n == 0 && !t.again) {
			return 0
		}
		if t.n > 0 {
			return t.n
		}
	}
	return 0
}

var _ io.Reader = (*bootSpin)(nil)
