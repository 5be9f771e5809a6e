package workload

import (
	"encoding/binary"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// The preamble a client sends first on each connection: role (1) | parameter (4).
const preambleLen = 5

// Roles a client asks the server to play; see the package documentation.
const (
	roleDrain = 'D'
	roleEcho  = 'E'
	roleFirst = 'F'
	roleIdle  = 'I'
	roleHTTP  = 'H'
	roleGRPC  = 'G'
)

// readyByte is what the server answers a drain preamble with once it is ready to read:
// the client starts measuring after it, so that the server's setup (its buffer, say)
// is not measured.
const readyByte = 'R'

// maxBuffer bounds the buffer a preamble may ask the server for.
const maxBuffer = 16 << 20

// preambleTimeout bounds the wait for a new connection's preamble.
const preambleTimeout = 10 * time.Second

// Server serves the server side of every workload on one listener: each connection's
// preamble says which. It is what rsockperf runs in server mode.
type Server struct {
	ln           net.Listener
	httpQ, grpcQ *connQueue
	hs           *http.Server
	gs           *grpc.Server
	wg           sync.WaitGroup
	idle         atomic.Int64

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

// Serve serves workloads on ln until Close.
func Serve(ln net.Listener) *Server {
	s := &Server{
		ln:    ln,
		httpQ: newConnQueue(ln.Addr()),
		grpcQ: newConnQueue(ln.Addr()),
		conns: make(map[net.Conn]struct{}),
	}
	s.hs = &http.Server{
		Handler:           httpHandler(),
		ReadHeaderTimeout: preambleTimeout,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	s.gs = newGRPCServer()
	s.wg.Go(func() { s.hs.Serve(s.httpQ) })
	s.wg.Go(func() { s.gs.Serve(s.grpcQ) })
	s.wg.Go(s.acceptLoop)
	return s
}

// Addr returns the listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// IdleConns returns how many connections are in the idle role now.
func (s *Server) IdleConns() int64 { return s.idle.Load() }

// Close stops the server and closes its connections.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	s.hs.Close()
	s.gs.Stop()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: wait and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !s.track(c) {
			c.Close()
			return
		}
		s.wg.Go(func() { s.handle(c) })
	}
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// handle reads a connection's preamble and plays the role it asks for.
func (s *Server) handle(c net.Conn) {
	var pre [preambleLen]byte
	c.SetReadDeadline(time.Now().Add(preambleTimeout))
	_, err := io.ReadFull(c, pre[:])
	c.SetReadDeadline(time.Time{})
	if err != nil {
		s.untrack(c)
		c.Close()
		return
	}
	param := int(binary.BigEndian.Uint32(pre[1:]))
	switch pre[0] {
	case roleHTTP, roleGRPC:
		// net/http's or grpc-go's server owns the connection from here.
		s.untrack(c)
		q := s.httpQ
		if pre[0] == roleGRPC {
			q = s.grpcQ
		}
		if !q.push(c) {
			c.Close()
		}
		return
	}
	defer func() {
		s.untrack(c)
		c.Close()
	}()
	switch pre[0] {
	case roleDrain:
		buf := make([]byte, min(max(param, 1), maxBuffer))
		if _, err := c.Write([]byte{readyByte}); err != nil {
			return
		}
		var total uint64
		for {
			n, err := c.Read(buf)
			total += uint64(n)
			if err != nil {
				if err == io.EOF {
					var ack [8]byte
					binary.BigEndian.PutUint64(ack[:], total)
					c.Write(ack[:])
				}
				return
			}
		}
	case roleEcho:
		buf := make([]byte, min(max(param, 1), maxBuffer))
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	case roleFirst:
		if _, err := c.Write(pre[:1]); err != nil {
			return
		}
		io.Copy(io.Discard, c)
	case roleIdle:
		s.idle.Add(1)
		io.Copy(io.Discard, c)
		s.idle.Add(-1)
	}
}

// connQueue is a net.Listener fed with connections by the Server: the listener that
// net/http's and grpc-go's servers serve.
type connQueue struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) push(c net.Conn) bool {
	select {
	case q.conns <- c:
		return true
	case <-q.done:
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }
