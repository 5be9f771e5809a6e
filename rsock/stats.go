package rsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// ConnStats is a snapshot of what a [Conn] has done, from [Conn.Stats]. Counters only
// grow; occupancies are as of the snapshot. The fields marked RDMA are zero on TCP and
// QUIC.
type ConnStats struct {
	// Transport is [Conn.Transport], and FallbackReason [Conn.FallbackReason].
	Transport      string
	FallbackReason error

	// BytesRead and BytesWritten count the bytes the application read from and wrote
	// to the Conn, on every transport (over "rdma+tls", the plaintext).
	BytesRead, BytesWritten uint64

	// RDMA: MessagesSent and MessagesReceived count the data messages (RDMA writes
	// with immediate that carry bytes) each way; a Write is one or more of them, as
	// credit and the ring's end cut it. Credit updates, keepalives and other control
	// messages are not counted.
	MessagesSent, MessagesReceived uint64
	// RDMA: Placements counts the Reads whose buffer the peer wrote the bytes into
	// directly, without the copy out of the receive ring (see
	// [Config.NoDirectPlacement]), and BytesPlaced those bytes, which BytesRead
	// includes.
	Placements, BytesPlaced uint64
	// RDMA: CreditStalls counts the times a Write waited because the peer had granted
	// no credit (its ring, and its buffer beyond the ring, were full: a slow reader),
	// and CreditStallTime is how long those waits lasted in all.
	CreditStalls    uint64
	CreditStallTime time.Duration
	// RDMA: CompletionErrors counts failed work completions (the first failure moves
	// the queue pair to ERROR, and the requests then outstanding flush, each one a
	// failed completion too); RNRErrors counts those that failed because the peer had
	// no receive request posted after every retry.
	CompletionErrors, RNRErrors uint64
	// RDMA: RingSize is the receive ring's current size and RingUsed the bytes in it
	// not read yet; Spilled is the bytes not read yet that were moved out of the ring
	// into ordinary memory ([Config.ReadBufferSize]). StagingSize is the registered
	// send buffer's current size, StagingUsed the bytes of it posted and not yet
	// acknowledged.
	RingSize, RingUsed, Spilled int
	StagingSize, StagingUsed    int
	// RDMA: RecvWQEs is how many receive requests the connection keeps posted now: it
	// starts at [Config.RecvWQEs] and, by default, grows while a one-way stream of
	// small messages runs out of them.
	RecvWQEs int
}

// Stats returns the connection's statistics. It allocates nothing and takes no lock
// other than, on RDMA, the engine's for a moment, so it is cheap enough to call on
// every request. It may be called after Close.
func (c *Conn) Stats() ConnStats {
	s := ConnStats{
		Transport:      c.transport,
		FallbackReason: c.reason,
		BytesRead:      c.st.read.Load(),
		BytesWritten:   c.st.written.Load(),
	}
	if e := c.st.engine; e != nil {
		es := e.Stats()
		s.MessagesSent, s.MessagesReceived = es.MessagesSent, es.MessagesReceived
		s.Placements, s.BytesPlaced = es.Placements, es.BytesPlaced
		s.CreditStalls, s.CreditStallTime = es.CreditStalls, es.CreditStallTime
		s.CompletionErrors, s.RNRErrors = es.CompletionErrors, es.RNRErrors
		s.RingSize, s.RingUsed, s.Spilled = es.RingSize, es.RingUsed, es.Spilled
		s.StagingSize, s.StagingUsed = es.StagingSize, es.StagingUsed
		s.RecvWQEs = es.RecvWQEs
	}
	return s
}

// Life cycle of a Conn as the process-wide counters see it (connCounters.state).
const (
	connNew    = iota // being set up: not yet handed to the application
	connOpen          // returned by Dial or Accept: counted as open
	connClosed        // closed
)

// connCounters is a Conn's share of the statistics: its byte counts, its RDMA engine
// (whose counters the engine keeps), its tracer, and where it is in its life cycle.
// Counting a Read or Write is one atomic add; a failed one also checks the tracer.
type connCounters struct {
	read, written atomic.Uint64
	engine        *rdma.Conn // the RDMA stream, or nil
	state         atomic.Int32
	tracer        *ConnTracer // set once, before the Conn is handed out; or nil
	failed        atomic.Bool // the tracer heard of a failure
}

// engineOf returns the RDMA engine's stream behind data, or nil.
func engineOf(data stream) *rdma.Conn {
	e, _ := data.(*rdma.Conn)
	return e
}

// didRead counts a Read's n bytes and passes its results on.
func (s *connCounters) didRead(n int, err error) (int, error) {
	if !rdma.StatsOff.Load() {
		s.read.Add(uint64(n))
	}
	if err != nil && s.tracer != nil {
		s.fail(err)
	}
	return n, err
}

// didWrite counts a Write's n bytes and passes its results on.
func (s *connCounters) didWrite(n int, err error) (int, error) {
	if !rdma.StatsOff.Load() {
		s.written.Add(uint64(n))
	}
	if err != nil && s.tracer != nil {
		s.fail(err)
	}
	return n, err
}

// didRead64 and didWrite64 are didRead and didWrite for io.WriterTo and io.ReaderFrom.
func (s *connCounters) didRead64(n int64, err error) (int64, error) {
	m, err := s.didRead(int(n), err)
	return int64(m), err
}

func (s *connCounters) didWrite64(n int64, err error) (int64, error) {
	m, err := s.didWrite(int(n), err)
	return int64(m), err
}

// fail tells the tracer about the connection's first failure. The end of the stream,
// a deadline and a closed Conn are not failures.
func (s *connCounters) fail(err error) {
	if err == io.EOF || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
		return
	}
	if s.tracer.Failed != nil && s.failed.CompareAndSwap(false, true) {
		s.tracer.Failed(err)
	}
}

// opened is called as c is handed to the application, by Dial (client) or Accept,
// with the resolved cfg: c counts as open from now on, its tracer is created, and it
// hears how the connection was set up.
func (s *connCounters) opened(c *Conn, cfg *Config, client bool) {
	if !s.state.CompareAndSwap(connNew, connOpen) {
		return
	}
	if cfg.Tracer != nil {
		s.tracer = cfg.Tracer(TraceInfo{Conn: c, Client: client})
	}
	metrics.opened(c)
	if t := s.tracer; t != nil {
		if s.engine != nil {
			s.engine.SetHooks(&rdma.Hooks{CreditStall: t.CreditStall, Failed: func(err error) {
				if t.Failed != nil && s.failed.CompareAndSwap(false, true) {
					t.Failed(err)
				}
			}})
		}
		switch {
		case s.engine != nil && t.Upgraded != nil:
			t.Upgraded(c.transport)
		case s.engine == nil && t.FellBack != nil:
			t.FellBack(c.transport, c.reason)
		}
	}
}

// closed is called by Close: an open c no longer counts as open, its bytes join the
// closed connections' totals, and its tracer hears of the end. Only the first call
// does anything.
func (s *connCounters) closed(c *Conn) {
	if !s.state.CompareAndSwap(connOpen, connClosed) {
		s.state.CompareAndSwap(connNew, connClosed)
		return
	}
	metrics.closed(c)
	if t := s.tracer; t != nil && t.Closed != nil {
		t.Closed(c.Stats())
	}
}
