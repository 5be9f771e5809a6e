package rsock

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs"
)

// Fallback selects the transport a connection starts on and stays on without RDMA.
type Fallback int

const (
	// FallbackTCP runs connections over TCP. It is the default.
	FallbackTCP Fallback = iota
	// FallbackQUIC runs connections over QUIC (one stream per connection), which needs
	// [Config.TLSConfig]. A Listener with FallbackQUIC serves TCP clients too.
	FallbackQUIC
)

func (f Fallback) String() string {
	switch f {
	case FallbackTCP:
		return "tcp"
	case FallbackQUIC:
		return "quic"
	}
	return fmt.Sprintf("Fallback(%d)", int(f))
}

// Transport names, as [Conn.Transport] reports them.
const (
	TransportRDMA = "rdma"
	TransportTCP  = "tcp"
	TransportQUIC = "quic"
	// TransportRDMATLS is RDMA carrying a TLS 1.3 stream: what a connection whose
	// bootstrap is QUIC gets by default, so that the upgrade keeps the encryption the
	// bootstrap promised (see [Config.AllowPlaintextRDMA]).
	TransportRDMATLS = "rdma+tls"
)

// Defaults of [Config] fields left zero.
const (
	DefaultHandshakeTimeout        = 10 * time.Second
	DefaultMaxConcurrentHandshakes = 128
	DefaultKeepAlive               = 15 * time.Second
	DefaultPlainSniffTimeout       = 200 * time.Millisecond
	DefaultReadBufferSize          = rdma.DefaultReadBufferSize
	DefaultLinger                  = rdma.DefaultLinger

	// Bounds on what a Listener's clients hold over RDMA (see Config.MaxRDMAConnsPerRemote).
	DefaultMaxRDMAConnsPerRemote          = 8192
	DefaultMaxRDMAConnsPerListener        = 32768
	DefaultMaxRegisteredMemoryPerRemote   = 2 << 30
	DefaultMaxRegisteredMemoryPerListener = 8 << 30
)

// Config configures Listen, Dial and Dialer. A nil *Config, and each zero field, means
// the default. Listen and Dial refuse a field out of its range, with an error matching
// [ErrInvalidConfig] that names the field and the range. A Config may be shared by many Listeners and Dialers; it must not be
// modified while they use it.
type Config struct {
	// Provider is the RDMA provider. Nil selects the default provider; this build has
	// none, so connections fall back with [ErrNoProvider] unless one is set here.
	// Tests set the software provider (verbs/soft) here.
	Provider verbs.Provider

	// DisableRDMA keeps connections on the fallback transport even when a provider is
	// configured or available: this side neither offers nor accepts RDMA, and says so
	// with [ErrNoProvider]. The environment variable RSOCK_DISABLE_RDMA=1
	// ([EnvDisableRDMA]) sets it for every Config of the process, and wins over a
	// Config that leaves it false.
	DisableRDMA bool

	// DisableSHM keeps connections between two processes of one host off shared
	// memory (see TransportSHM): with no Provider configured, a peer reached over
	// loopback or at this host's own address is otherwise connected through it.
	DisableSHM bool

	// Fallback is the transport connections start on, and stay on without RDMA.
	// Default FallbackTCP.
	Fallback Fallback
	// TLSConfig is required with FallbackQUIC and unused otherwise. A Listener needs a
	// certificate in it; a dialer verifies the server with it. If it names no
	// application protocol (NextProtos), "rsock" is used. It is cloned, never modified.
	TLSConfig *tls.Config
	// AllowPlaintextRDMA lets a connection whose bootstrap is QUIC, and so encrypted,
	// move its bytes over RDMA in plaintext. Both sides must allow it: if either does
	// not, the RDMA stream runs TLS 1.3 with TLSConfig (the dialer verifies the server's
	// certificate as QUIC does) and [Conn.Transport] reports "rdma+tls". A connection
	// bootstrapped over TCP is plaintext already and is not affected. See the package
	// documentation, section Security.
	AllowPlaintextRDMA bool
	// QUICConfig tunes quic-go with FallbackQUIC; nil means quic-go's defaults. rsock
	// overrides its stream limits (see package fallback).
	QUICConfig *quic.Config

	// HandshakeTimeout bounds the hello exchange (and, on a Listener, the wait for a
	// QUIC client's stream). A connection whose handshake overruns it is closed.
	// Default DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxConcurrentHandshakes bounds how many accepted connections a Listener holds
	// that are in their handshake or waiting for Accept. Beyond it, new connections wait
	// in the kernel's backlog (or quic-go's queue). Default
	// DefaultMaxConcurrentHandshakes.
	MaxConcurrentHandshakes int
	// KeepAlive is the keep-alive period of the bootstrap connection: TCP keep-alive,
	// or QUIC keep-alive packets (unless QUICConfig sets a period). Negative disables
	// it. Default DefaultKeepAlive.
	//
	// Over RDMA it is also the liveness period: each period a probe crosses the queue
	// pair, so a peer that falls silent, from the start of the connection on, is
	// detected within a period and the QP's retry budget (a dead path: ErrQPFailed),
	// and at most four periods after its last sign of life (ErrKeepaliveTimeout); see
	// "Failures" in the package docs.
	KeepAlive time.Duration

	// AcceptPlainClients lets a Listener serve clients that send no rsock hello: it
	// tells them apart by their first bytes and hands them to Accept untouched, as
	// TCP connections whose [Conn.FallbackReason] matches [ErrPlainClient].
	//
	// The cost: a client that waits for the server to speak first (SMTP, MySQL, ...)
	// is only recognized as plain when PlainSniffTimeout passes without it sending
	// anything, so the server's first bytes reach it that much later. A plain client
	// whose first four bytes happen to be the hello's magic (0x89 'R' 'S' 'K') is taken
	// for an rsock client and fails its handshake. QUIC clients are always rsock's.
	AcceptPlainClients bool
	// PlainSniffTimeout is how long a Listener with AcceptPlainClients waits for a
	// client's first bytes before handing it through as plain. Default
	// DefaultPlainSniffTimeout.
	PlainSniffTimeout time.Duration

	// Logger receives a Listener's reports: at WARN, clients refused because they speak
	// no rsock (with a hint about AcceptPlainClients) and accept errors; at INFO, other
	// failed handshakes; at DEBUG, each accepted connection with its transport and
	// fallback reason.
	//
	// Nil logs WARN and above to [slog.Default] (the standard logger's output, stderr,
	// unless the program set another default), as net/http logs failed TLS handshakes to
	// stderr: a server that refuses every curl must not do so in silence. To log
	// nothing, set slog.New(slog.DiscardHandler).
	Logger *slog.Logger

	// Tracer, if set, is called for each connection as Dial returns it or Accept hands
	// it out, and the [ConnTracer] it returns (nil for none) receives that
	// connection's events: upgrade or fallback, credit stalls, its first failure, its
	// close. Nil, the default, costs nothing.
	Tracer func(TraceInfo) *ConnTracer

	// The fields below are used only on the RDMA transport. Zero selects the RDMA
	// engine's default.

	// RingSize is the size in bytes of each connection's receive ring, into which the
	// peer writes: a power of two from 4 KiB to 1 GiB, the size the ring starts at
	// when it grows (GrowRingTo), else its size. Default 8 KiB.
	RingSize int
	// GrowRingTo lets each connection's ring start at RingSize and grow, by factors of
	// four, up to GrowRingTo (a power of two of at most 1 GiB) while a stream keeps it
	// busy, and shrink back when the connection idles; the send staging buffer
	// likewise starts at half the first ring, grows up to SendBufferSize (by default
	// half of GrowRingTo, at most 256 KiB, or 1 MiB on rdma-core) and shrinks back
	// when the connection idles. Default 4 MiB, about as far as Linux's TCP
	// autotuning grows a receive buffer, so an idle connection holds little (about
	// 58 KiB per end in all, 12 KiB of it registered) and a busy stream has the ring it
	// needs. Toward a peer running an rsock from before rings grew past 512 KiB, they
	// grow to 512 KiB at most. Negative, or equal to RingSize, keeps a fixed ring of
	// RingSize and a staging buffer of SendBufferSize (a RingSize of 128 KiB or more
	// without GrowRingTo is fixed too).
	GrowRingTo int
	// SendBufferSize is the size in bytes of each connection's registered send staging
	// buffer, 1 KiB to 1 GiB: by default half of GrowRingTo, at most 256 KiB, for a
	// ring that grows (at most 1 MiB on rdma-core, where every Write under 1 MiB is
	// copied into it and its size is what a stream has in flight), else 64 KiB.
	SendBufferSize int
	// RecvWQEs is the number of receive work requests each connection keeps posted,
	// 8 to 32768; it is the peer's initial work-request credit. Zero, the default,
	// starts at 64 and doubles, to 128, while a one-way stream of messages small
	// against the ring runs out of them (each takes one, whatever its size); requests
	// and responses never grow it. A value set here is kept as set: the queue does not
	// grow.
	RecvWQEs int
	// MaxRDMAConns, if positive, caps the RDMA connections open at once on each RDMA
	// device of the process (the count is per device, shared by every Config that uses
	// it). Connections beyond it fall back, with a reason matching
	// [ErrResourcesExhausted].
	MaxRDMAConns int

	// MaxRDMAConnsPerRemote and MaxRDMAConnsPerListener bound the RDMA connections (each
	// one queue pair) that a Listener's clients hold at once: those from one remote
	// address, and all of them. MaxRegisteredMemoryPerRemote and
	// MaxRegisteredMemoryPerListener bound the bytes of memory the Listener registers
	// (pins) for them, the same way. They are counted from the moment a client's offer
	// is answered, before the client has proven anything, until the connection closes;
	// on a warm device, from the moment the connection is accepted (the Listener
	// prepares its side while the offer is on its way), until the handshake ends for a
	// client that does not upgrade.
	// A connection past a limit falls back to its bootstrap transport, both sides with
	// a reason matching [ErrResourcesExhausted] that names the limit and its figure
	// (the client's through the server's decline). A remote address is the client's
	// IP, or for IPv6 its /64. Negative means no limit. Dialers ignore these fields.
	//
	// The defaults (DefaultMaxRDMAConnsPerRemote and its siblings: 8192 and 32768
	// connections, 2 GiB and 8 GiB) let one client host hold a quarter of what the
	// listener will, and keep a listener's connections at half the queue pairs of a
	// Soft-RoCE device, while a client host with pools of thousands of connections
	// still runs on RDMA. Lower them for a server that untrusted hosts can reach.
	MaxRDMAConnsPerRemote          int
	MaxRDMAConnsPerListener        int
	MaxRegisteredMemoryPerRemote   int64
	MaxRegisteredMemoryPerListener int64
	// PollSpin is how many empty completion-queue polls the engine makes, yielding
	// between them, before it sleeps on the completion channel. On rdma-core it polls
	// a few times between two yields (on Soft-RoCE it yields only to goroutines), and
	// a Read that follows a Write spins longer: eight times as many polls, sixty-four
	// on Soft-RoCE. Negative never spins.
	// It also bounds the non-blocking reads with which the RDMA handshake waits for the
	// peer's answers on the bootstrap TCP connection before it blocks.
	PollSpin int
	// ReadBufferSize is how many bytes a connection buffers in ordinary (unpinned)
	// memory, beyond its receive ring, while its application is not reading: what TCP
	// keeps in the kernel's socket buffers. A peer's writes go on until the ring and
	// this buffer are full, whether or not this side has called Accept or Read, so
	// programs written for TCP (write a whole request, then read) do not block early
	// or deadlock. The buffer grows only as bytes wait in it and shrinks as they are
	// read. At most 1 GiB; negative means none, the ring alone buffers. Default
	// DefaultReadBufferSize, 4 MiB, which absorbs what TCP absorbs on loopback with
	// Linux's defaults.
	ReadBufferSize int
	// Linger bounds how long Close waits for the peer's device to acknowledge the
	// bytes Write accepted and the end of stream after them, like SO_LINGER. The wait
	// does not depend on the peer's application reading (the peer buffers, see
	// ReadBufferSize): it is one round trip unless the peer's machine stops answering.
	// Past it, the connection is torn down, and the peer reads the bytes that arrived
	// and then an error, never a clean io.EOF. Negative means Close does not wait.
	// Default DefaultLinger.
	Linger time.Duration
	// MaxRegisteredMemory, if positive, caps the memory the process registers with
	// each RDMA device (receive rings and send buffers of all its connections there,
	// shared by every Config). Connections beyond it fall back with a reason matching
	// [ErrMemoryBudget] that names the figures. Whatever it says, on a device that pins
	// registered memory (rdma-core) connections fall back with [ErrMemlock] before the
	// process's pinned memory would pass RLIMIT_MEMLOCK, unless it has CAP_IPC_LOCK.
	MaxRegisteredMemory int64
	// NoDirectPlacement keeps the peer out of this side's Read buffers. By default, on
	// a provider that registers the application's memory without pinning it (verbs/soft,
	// whose peers are goroutines of this process), a Read of at least 128 KiB that finds
	// nothing buffered lets the peer write the next bytes of the stream straight into
	// its buffer, saving the copy out of the receive ring, when both sides allow it. The
	// buffer is registered for the connection's queue pair and stays registered for
	// reuse, and the peer may write anywhere in it while the Read waits, as the Read
	// itself may. Set it to have every byte copied out of the ring instead. rdma-core
	// (verbs/ibv) and the same-host transport never place.
	NoDirectPlacement bool

	// Lossless traffic classes. A RoCE fabric that runs RDMA in a lossless (PFC) class
	// recognizes its packets by their DSCP or their VLAN priority; these fields put the
	// connection's queue pair in that class. They change nothing on the fallback
	// transports.

	// TrafficClass is the traffic class of the connection's RoCE packets, 0 to 255: the
	// GRH's, which RoCE v2 sends as the IP header's traffic class byte (DSCP in the upper
	// six bits, ECN in the lower two). For DSCP 26, set 26<<2. Default 0.
	TrafficClass int
	// ServiceLevel is the service level of the connection's queue pair, 0 to 15; a RoCE
	// device maps it to the VLAN priority (PCP) of the QP's packets. Default 0.
	ServiceLevel int
	// RoCEVersion prefers source GIDs of this RoCE version, 1 or 2, where the
	// connection's address has a GID of each; 0, the default, leaves the choice to the
	// device selector (RoCE v2 where there is one).
	RoCEVersion int
}

// resolve returns a copy of c (nil for defaults) with defaults filled in, or an error if
// c is invalid.
func (c *Config) resolve() (*Config, error) {
	r := &Config{}
	if err := c.resolveInto(r); err != nil {
		return nil, err
	}
	return r, nil
}

// resolveInto is resolve writing the copy into r, for a caller that keeps it inside a
// struct it allocates anyway (a dial's state), rather than in one more allocation.
func (c *Config) resolveInto(r *Config) error {
	*r = Config{}
	if c != nil {
		*r = *c
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&r.HandshakeTimeout, DefaultHandshakeTimeout)
	def(&r.KeepAlive, DefaultKeepAlive)
	def(&r.PlainSniffTimeout, DefaultPlainSniffTimeout)
	if r.MaxConcurrentHandshakes == 0 {
		r.MaxConcurrentHandshakes = DefaultMaxConcurrentHandshakes
	}
	if r.MaxRDMAConnsPerRemote == 0 {
		r.MaxRDMAConnsPerRemote = DefaultMaxRDMAConnsPerRemote
	}
	if r.MaxRDMAConnsPerListener == 0 {
		r.MaxRDMAConnsPerListener = DefaultMaxRDMAConnsPerListener
	}
	if r.MaxRegisteredMemoryPerRemote == 0 {
		r.MaxRegisteredMemoryPerRemote = DefaultMaxRegisteredMemoryPerRemote
	}
	if r.MaxRegisteredMemoryPerListener == 0 {
		r.MaxRegisteredMemoryPerListener = DefaultMaxRegisteredMemoryPerListener
	}
	if err := r.applyEnv(processEnv()); err != nil { // env.go
		return err
	}
	if r.Logger == nil {
		r.Logger = defaultLogger() // listener_log.go
	}
	return r.check() // config_check.go
}
