package rsock

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// A Listener keeps one RDMA endpoint prepared ahead for its next client: its spare.
// Preparing an endpoint (a queue pair, its receive WQEs, a pooled ring and staging
// buffer) is the largest step of the server's handshake that does not wait for the
// client; on verbs/soft it took 12–14 µs of a connection's 170–180, and on hardware
// creating a queue pair is a call into the kernel. With a spare, the handshake of a
// client whose offer arrives on the spare's local address starts from a prepared
// endpoint (prepareEarly). The spare is prepared when a connection the Listener
// accepted over RDMA closes (Conn.Close starts it), outside any handshake: that closing
// released an endpoint on the same device, so the spare holds no more than the Listener
// held a moment before; and a client that comes while it is being prepared waits for
// it rather than prepare another beside it (take).
//
// The spare is bounded: one per Listener, prepared only on a device that is warm
// (rdma.Warm: nothing is listed or opened for it), released after spareIdle if no
// client takes it, and when the Listener closes. It counts against the process's
// registered-memory budget and RLIMIT_MEMLOCK as any endpoint does, and its device is
// in use while it waits: CloseIdleDevices releases every Listener's spare first. It is
// not charged to the Listener's per-listener and per-remote limits while it waits (it
// belongs to no client): the client that takes it is charged then
// (rdma.Endpoint.AdoptBudget), and a refused charge releases it, and the handshake
// prepares as it would have without it, to be refused in the same words.

// spareIdle is how long a spare waits for a client before it is released: a Listener
// whose connections stopped coming gives its endpoint back, and its device may then go
// idle as it would have.
const spareIdle = time.Second

// spareEndpoint is a Listener's spare: see above.
type spareEndpoint struct {
	mu      sync.Mutex
	ep      *rdma.Endpoint
	ip      netip.Addr  // the local address ep was prepared for
	filling bool        // a refill is preparing an endpoint
	fillIP  netip.Addr  // the local address the refill under way prepares for
	filled  *sync.Cond  // on mu: broadcast as a refill ends; made with the first
	closed  bool        // the Listener closed: no more spares
	idle    *time.Timer // releases ep after spareIdle; made with the first spare, when s joins spares
	until   time.Time   // when idle releases ep
}

// spares are the Listeners' spares that ever held an endpoint and whose Listener is
// open, for CloseIdleDevices.
var spares = struct {
	sync.Mutex
	set map[*spareEndpoint]struct{}
}{set: make(map[*spareEndpoint]struct{})}

// releaseSpares releases every Listener's spare, as if each had waited out spareIdle.
func releaseSpares() {
	spares.Lock()
	all := make([]*spareEndpoint, 0, len(spares.set))
	for s := range spares.set {
		all = append(all, s)
	}
	spares.Unlock() // fill takes it under a spare's mu, which release takes
	for _, s := range all {
		s.release()
	}
}

// take hands over the spare if it was prepared for local address ip, charging it to
// budget, the client's (nil: none). It returns nil when there is no such spare, or when
// budget refuses it (the spare is then released).
//
// A refill for ip that is under way is waited for: its endpoint is this client's. A
// client that came while the spare was being prepared, the Close that started it just
// returned, would otherwise prepare a second endpoint beside it, and the two would hold
// one more than the Listener held a moment before: with Config.MaxRDMAConns reached,
// the client's was refused and the connection fell back to TCP although a closed one
// had just made room (TestRDMAConnLimit, one run in seven with -race). The wait is the
// preparation the client would make itself.
func (s *spareEndpoint) take(ip netip.Addr, budget rdma.Budget) *rdma.Endpoint {
	s.mu.Lock()
	if s.filling && s.fillIP == ip {
		s.waitFill()
	}
	ep := s.ep
	if ep == nil || s.ip != ip {
		s.mu.Unlock()
		return nil
	}
	s.ep = nil
	s.idle.Stop()
	s.mu.Unlock()
	if err := ep.AdoptBudget(budget); err != nil {
		ep.Abort()
		return nil
	}
	return ep
}

// refill starts preparing a spare for local address ip, in a goroutine of its own,
// unless there is one, one is being prepared, or the Listener closed. ctx is the
// Listener's. Creating a queue pair is a call into the kernel on hardware: the Close
// that asks for a spare does not wait for it.
func (s *spareEndpoint) refill(ctx context.Context, cfg *Config, ip netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ep != nil || s.filling || s.closed {
		return
	}
	s.filling, s.fillIP = true, ip
	if s.filled == nil {
		s.filled = sync.NewCond(&s.mu)
	}
	go s.fill(ctx, cfg, ip)
}

// waitFill waits for a refill under way to end. Called with mu held.
func (s *spareEndpoint) waitFill() {
	for s.filling {
		s.filled.Wait()
	}
}

// fill prepares the spare refill started, if the device is warm, and installs it.
func (s *spareEndpoint) fill(ctx context.Context, cfg *Config, ip netip.Addr) {
	s.install(prepareSpare(ctx, cfg, ip), ip)
}

// install ends a refill: ep, prepared for ip (nil if none could be), becomes the spare
// unless the Listener closed meanwhile, and whoever waits for the refill is woken.
func (s *spareEndpoint) install(ep *rdma.Endpoint, ip netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.filling = false
	s.filled.Broadcast()
	if ep == nil {
		return
	}
	if s.closed {
		ep.Abort()
		return
	}
	s.ep, s.ip, s.until = ep, ip, time.Now().Add(spareIdle)
	if s.idle == nil {
		s.idle = time.AfterFunc(spareIdle, s.expire)
		spares.Lock()
		spares.set[s] = struct{}{}
		spares.Unlock()
	} else {
		s.idle.Reset(spareIdle)
	}
}

// prepareSpare prepares an endpoint for local address ip on a warm device, without a
// budget (the client that takes it adopts one), or returns nil.
func prepareSpare(ctx context.Context, cfg *Config, ip netip.Addr) *rdma.Endpoint {
	p, err := cfg.provider()
	if err != nil {
		return nil
	}
	opts := cfg.rdmaOptions()
	if !rdma.Warm(p, ip, opts) {
		return nil
	}
	ep, err := rdma.PrepareContext(ctx, p, ip, opts)
	if err != nil {
		return nil
	}
	return ep
}

// expire releases a spare that waited spareIdle for a client: the idle timer's callback.
// A spare made since the timer was set is left alone: a callback already under way when
// fill reset the timer finds the new spare's wait not over.
func (s *spareEndpoint) expire() {
	s.mu.Lock()
	ep := s.ep
	if ep == nil || time.Now().Before(s.until) {
		s.mu.Unlock()
		return
	}
	s.ep = nil
	s.mu.Unlock()
	if ep != nil {
		ep.Abort()
	}
}

// release releases the spare once a refill under way has ended, for
// CloseIdleDevices: the device must not be found in use by a spare made just after.
func (s *spareEndpoint) release() {
	s.mu.Lock()
	s.waitFill()
	ep := s.ep
	s.ep = nil
	s.mu.Unlock()
	if ep != nil {
		ep.Abort()
	}
}

// close releases the spare, stops refills and waits for one under way: the Listener
// is closing.
func (s *spareEndpoint) close() {
	s.mu.Lock()
	s.closed = true
	s.waitFill()
	ep := s.ep
	s.ep = nil
	joined := s.idle != nil
	if joined {
		s.idle.Stop()
	}
	s.mu.Unlock()
	if ep != nil {
		ep.Abort()
	}
	if joined {
		spares.Lock()
		delete(spares.set, s)
		spares.Unlock()
	}
}
