package rsock

import (
	"context"
	"errors"
	"expvar"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"weak"

	"github.com/rsockio/rsock/internal/vma"
)

// Process-wide counters, published with expvar as the variable "rsock" (served as JSON
// at /debug/vars by net/http's default mux, like every expvar variable):
//
//	{
//	  "conns_opened":       {"rdma": 3, "rdma+tls": 1, "tcp": 2, "quic": 1, "shm": 0, "other": 0},
//	  "conns_open":         {"rdma": 1, ...},
//	  "bytes_read":         {"rdma": 1048576, ...},
//	  "bytes_written":      {"rdma": 4096, ...},
//	  "fallbacks":          {"no_provider": 1, "declined_no_device": 1, "plain_client": 1, ...},
//	  "handshake_failures": {"not_rsock": 1, "timeout": 0, ...},
//	  "memory_mappings":    {"held": 1212, "budget": 32765}
//	}
//
// A connection counts from the moment Dial returns it or Accept hands it out (so a
// process that is both ends of a connection counts it twice) until its Close. Its bytes
// are those its application read and wrote; the totals add the open connections' counts
// to the closed ones'. "fallbacks" counts the connections that opened on TCP or QUIC, by
// reason: the keys below, and, for the reasons a peer's decline can carry, the same
// with "declined_" in front when the peer declined the upgrade for that reason. "handshake_failures" counts connections that failed before Dial
// returned them or Accept could hand them out, by cause: a Listener's, and a Dialer's
// after its bootstrap connection was up. "memory_mappings" is the memory mappings
// rsock's providers hold now (a same-host connection end counts about six) and the most
// they may hold, half of vm.max_map_count; past it, connections fall back to TCP.
//
// Each key set is small and fixed, so the page has the same keys every time.

// transportKeys are the transports the counters keep apart, in [transportIndex] order.
var transportKeys = [...]string{TransportRDMA, TransportRDMATLS, TransportTCP, TransportQUIC, TransportSHM, "other"}

func transportIndex(t string) int {
	for i, k := range transportKeys[:len(transportKeys)-1] {
		if t == k {
			return i
		}
	}
	return len(transportKeys) - 1
}

// reasonKeys name the reasons a connection falls back, most specific first: the first
// sentinel a reason matches gives its key ([ErrMemoryBudget] also matches
// [ErrResourcesExhausted]).
var reasonKeys = [...]struct {
	err error
	key string
}{
	{ErrPlainClient, "plain_client"},
	{ErrNoProvider, "no_provider"},
	{ErrNoDevice, "no_device"},
	{ErrPeerOfferedNone, "peer_offered_none"},
	{ErrVersionMismatch, "version_mismatch"},
	{ErrMemoryBudget, "memory_budget"},
	{ErrMemlock, "memlock"},
	{ErrResourcesExhausted, "resources"},
	{ErrMTUMismatch, "mtu_mismatch"},
	{ErrNoRoute, "no_route"},
	{ErrRDMAUnavailable, "rdma_unavailable"},
	{ErrPathUnproven, "path_unproven"},
	{ErrUpgradeFailed, "upgrade_failed"},
	{nil, "other"},
}

// reasonIndex returns the index in reasonKeys of why, and whether the peer declined.
func reasonIndex(why error) (int, bool) {
	var fe *FallbackError
	peer := errors.As(why, &fe) && fe.Peer
	for i, r := range reasonKeys[:len(reasonKeys)-1] {
		if errors.Is(why, r.err) {
			return i, peer
		}
	}
	return len(reasonKeys) - 1, peer
}

// declinable reports whether a peer's decline can carry the reason err: the hello's
// decline reasons are a fixed set (declineErrs), and only those get a "declined_" key.
func declinable(err error) bool {
	for _, e := range declineErrs {
		if e != nil && e == err {
			return true
		}
	}
	return false
}

// causeKeys name the causes of a failed handshake, in the order they are tested.
var causeKeys = [...]struct {
	is  func(error) bool
	key string
}{
	{func(err error) bool { return errors.Is(err, ErrNotRsockPeer) }, "not_rsock"},
	{func(err error) bool { return errors.Is(err, ErrBadHello) }, "bad_hello"},
	{func(err error) bool { return errors.Is(err, ErrVersionMismatch) }, "version_mismatch"},
	{func(err error) bool { return errors.Is(err, context.Canceled) }, "canceled"},
	{func(err error) bool {
		return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
	}, "timeout"},
	{func(err error) bool {
		return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
	}, "peer_closed"},
	{func(error) bool { return true }, "other"},
}

func causeIndex(err error) int {
	for i, c := range causeKeys {
		if c.is(err) {
			return i
		}
	}
	return len(causeKeys) - 1 // unreachable: "other" matches everything
}

// metrics holds the process-wide counters.
var metrics processMetrics

type processMetrics struct {
	connsOpened, connsOpen [len(transportKeys)]atomic.Int64
	// fallbacks[i][0] counts this side's reason reasonKeys[i], [i][1] the peer's.
	fallbacks         [len(reasonKeys)][2]atomic.Int64
	handshakeFailures [len(causeKeys)]atomic.Int64

	mu sync.Mutex
	// live are the open connections, whose byte counts the totals add at read time.
	// They are held weakly: a Conn its program dropped without closing it is not kept
	// alive by the counters (its bytes then drop out of the totals).
	live map[weak.Pointer[Conn]]struct{}
	// closedRead and closedWritten are the bytes of the connections closed so far.
	closedRead, closedWritten [len(transportKeys)]uint64
}

// opened counts c, just handed to the application, as open.
func (m *processMetrics) opened(c *Conn) {
	t := transportIndex(c.transport)
	m.connsOpened[t].Add(1)
	m.connsOpen[t].Add(1)
	if c.st.engine == nil {
		i, peer := reasonIndex(c.reason)
		p := 0
		if peer {
			p = 1
		}
		m.fallbacks[i][p].Add(1)
	}
	m.mu.Lock()
	if m.live == nil {
		m.live = make(map[weak.Pointer[Conn]]struct{})
	}
	m.live[weak.Make(c)] = struct{}{}
	m.mu.Unlock()
}

// closed counts c, which was open, as closed.
func (m *processMetrics) closed(c *Conn) {
	t := transportIndex(c.transport)
	m.connsOpen[t].Add(-1)
	m.mu.Lock()
	delete(m.live, weak.Make(c))
	m.closedRead[t] += c.st.read.Load()
	m.closedWritten[t] += c.st.written.Load()
	m.mu.Unlock()
}

// handshakeFailed counts a handshake that failed with err.
func (m *processMetrics) handshakeFailed(err error) {
	m.handshakeFailures[causeIndex(err)].Add(1)
}

// snapshot returns the counters as the expvar variable shows them.
func (m *processMetrics) snapshot() map[string]map[string]int64 {
	byTransport := func(v *[len(transportKeys)]atomic.Int64) map[string]int64 {
		out := make(map[string]int64, len(transportKeys))
		for i, k := range transportKeys {
			out[k] = v[i].Load()
		}
		return out
	}
	fallbacks := make(map[string]int64, 2*len(reasonKeys))
	for i, r := range reasonKeys {
		fallbacks[r.key] = m.fallbacks[i][0].Load()
		if n := m.fallbacks[i][1].Load(); n != 0 || declinable(r.err) {
			fallbacks["declined_"+r.key] = n
		}
	}
	causes := make(map[string]int64, len(causeKeys))
	for i, c := range causeKeys {
		causes[c.key] = m.handshakeFailures[i].Load()
	}
	read := make(map[string]int64, len(transportKeys))
	written := make(map[string]int64, len(transportKeys))
	m.mu.Lock()
	r, w := m.closedRead, m.closedWritten
	for p := range m.live {
		c := p.Value()
		if c == nil {
			delete(m.live, p) // dropped without Close
			continue
		}
		t := transportIndex(c.transport)
		r[t] += c.st.read.Load()
		w[t] += c.st.written.Load()
	}
	m.mu.Unlock()
	for i, k := range transportKeys {
		read[k], written[k] = int64(r[i]), int64(w[i])
	}
	return map[string]map[string]int64{
		"conns_opened":       byTransport(&m.connsOpened),
		"conns_open":         byTransport(&m.connsOpen),
		"bytes_read":         read,
		"bytes_written":      written,
		"fallbacks":          fallbacks,
		"handshake_failures": causes,
		"memory_mappings":    {"held": vma.Held(), "budget": vma.Budget()},
	}
}

// expvarName is the name of the expvar variable that publishes the process-wide
// counters.
const expvarName = "rsock"

func init() {
	// expvar.Publish panics on a name taken: another copy of this package (vendored
	// twice) or the program may have published one. Then this one stays unpublished.
	if expvar.Get(expvarName) == nil {
		expvar.Publish(expvarName, expvar.Func(func() any { return metrics.snapshot() }))
	}
}
