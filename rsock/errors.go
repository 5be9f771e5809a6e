package rsock

import (
	"errors"

	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// Why a connection does not use RDMA. A [Conn]'s [Conn.FallbackReason] is a
// [*FallbackError] that matches one of these with [errors.Is]. None of them is an
// error to the application: the connection works, on its fallback transport.
var (
	// ErrNoProvider: no RDMA provider is configured or usable on this side.
	ErrNoProvider = errors.New("no RDMA provider")
	// ErrNoDevice: the provider has no RDMA device for the connection's address.
	ErrNoDevice = errors.New("no RDMA device")
	// ErrPeerOfferedNone: the peer's hello offered no RDMA.
	ErrPeerOfferedNone = errors.New("peer offered no RDMA")
	// ErrVersionMismatch: the peer speaks another version of the hello. The
	// connection stays on its bootstrap transport. A peer whose answer cannot be
	// understood because of its version fails the connection with this error.
	ErrVersionMismatch = errors.New("hello version mismatch")
	// ErrResourcesExhausted: queue pairs, memory registrations or other RDMA resources
	// ran out.
	ErrResourcesExhausted = errors.New("RDMA resources exhausted")
	// ErrMemoryBudget: registering the connection's memory would pass
	// [Config.MaxRegisteredMemory] on its device. Reasons matching it match
	// [ErrResourcesExhausted] too.
	ErrMemoryBudget = rdma.ErrMemoryBudget
	// ErrMemlock: registering the connection's memory would pass, or passed, the
	// process's RLIMIT_MEMLOCK. Reasons matching it match [ErrResourcesExhausted] too,
	// and say how to raise the limit.
	ErrMemlock = rdma.ErrMemlock
	// ErrMTUMismatch: the two ports' MTUs cannot be reconciled.
	ErrMTUMismatch = errors.New("RDMA path MTU mismatch")
	// ErrNoRoute: the peer's RDMA port is not reachable from this side's.
	ErrNoRoute = errors.New("no RDMA route to peer")
	// ErrRDMAUnavailable: this build has no RDMA stream engine.
	ErrRDMAUnavailable = errors.New("rdma engine not available")
	// ErrPathUnproven: the queue pairs connected, but no proof crossed the fabric both
	// ways on them in time (RoCE's UDP port 4791 filtered, traffic routed to another
	// device, a wrong GID), or the peer's proof did not belong to this connection (a
	// replayed or spliced hello). No application byte went over RDMA; both sides stay
	// on the bootstrap transport.
	ErrPathUnproven = errors.New("RDMA path unproven")
	// ErrUpgradeFailed: the upgrade failed for another reason (an internal error).
	ErrUpgradeFailed = errors.New("rdma upgrade failed")
	// ErrPeerDeclined: the peer declined the upgrade. A [*FallbackError] with Peer set
	// matches it together with the reason the peer gave.
	ErrPeerDeclined = errors.New("peer declined")
	// ErrPlainClient: the client spoke no rsock hello and was handed through as a plain
	// connection (see [Config.AcceptPlainClients]).
	ErrPlainClient = errors.New("plain client without rsock hello")
)

// Errors of a failed handshake. They fail the connection (not just the upgrade).
var (
	// ErrNotRsockPeer: the peer does not speak rsock. A client learns this on its first
	// Read; a Listener logs it and closes the connection.
	ErrNotRsockPeer = errors.New("peer does not speak rsock")
	// ErrBadHello: the peer's hello is malformed, truncated or oversized.
	ErrBadHello = errors.New("malformed hello")
)

// ErrInvalidConfig: a [Config] field is out of its range. Listen and Dial return it,
// wrapped with the field, its value and the range allowed, before they touch the
// network.
var ErrInvalidConfig = errors.New("invalid Config")

// FallbackError says why a connection does not run over RDMA. Its text reads like
// "rsock: upgrade to rdma: peer declined: no RDMA device".
type FallbackError struct {
	// Peer reports that the peer declined the upgrade; Err is then the reason it gave.
	// Otherwise this side decided, for the reason Err.
	Peer bool
	// Err matches one of the sentinel errors above with errors.Is, and may add detail.
	Err error
}

func (e *FallbackError) Error() string {
	if e.Peer {
		return "rsock: upgrade to rdma: peer declined: " + e.Err.Error()
	}
	return "rsock: upgrade to rdma: " + e.Err.Error()
}

// Unwrap returns Err, and [ErrPeerDeclined] when the peer declined.
func (e *FallbackError) Unwrap() []error {
	if e.Peer {
		return []error{ErrPeerDeclined, e.Err}
	}
	return []error{e.Err}
}

// Errors that end an RDMA connection, returned by its Read and Write (wrapped with what
// happened). Bytes that arrived before the failure are still returned first.
var (
	// ErrQPFailed: a work completion failed, so the queue pair is in ERROR (transport
	// retries exceeded, remote access error, flush...). The wrapped *verbs.WCError says
	// which.
	ErrQPFailed = rdma.ErrQPFailed
	// ErrCQFailed: the completion queue the connection shares overflowed or failed.
	ErrCQFailed = rdma.ErrCQFailed
	// ErrControlLost: the bootstrap connection, kept as control channel, ended without
	// the peer closing the stream: the peer process is gone.
	ErrControlLost = rdma.ErrControlLost
	// ErrKeepaliveTimeout: nothing arrived on the control channel for three keepalive
	// periods.
	ErrKeepaliveTimeout = rdma.ErrKeepaliveTimeout
	// ErrPeerClosed: a Write after the peer closed the connection.
	ErrPeerClosed = rdma.ErrPeerClosed
	// ErrProtocol: the peer broke the flow-control protocol.
	ErrProtocol = rdma.ErrProtocol
	// ErrDeviceFatal: the RDMA device failed (a fatal asynchronous event); every
	// connection on it fails at once.
	ErrDeviceFatal = rdma.ErrDeviceFatal
	// ErrPortDown: the connection's RDMA port went down (link or netdev down); every
	// connection on the port fails at once.
	ErrPortDown = rdma.ErrPortDown
	// ErrLingerTimeout: from Close, the peer did not acknowledge the bytes written
	// and the end of the stream within [Config.Linger]; they may be lost. (A Close
	// after the connection failed with bytes unacknowledged returns that failure.)
	ErrLingerTimeout = rdma.ErrLingerTimeout
)
