package rdma

import (
	"errors"

	"github.com/rsockio/rsock/flowctl"
)

// Limits, from flowctl's.
const (
	MinRingSize = flowctl.MinRingSize
	MaxRingSize = flowctl.MaxRingSize
	MinRecvWQEs = 8
	// maxInline caps the payload posted inline, whatever the device allows.
	maxInline = 256
)

// Errors a Conn fails with. Each is wrapped with what happened; errors.Is finds them.
var (
	// ErrTooManyConns reports that Options.MaxConns RDMA connections are open on the
	// device already.
	ErrTooManyConns = errors.New("rdma: connection limit reached")
	// ErrMemoryBudget reports that registering a connection's memory would take the
	// device past Options.MaxRegisteredMemory.
	ErrMemoryBudget = errors.New("rdma: registered-memory budget exceeded")
	// ErrMemlock reports that registering a connection's memory would take, or took,
	// the process's pinned memory past RLIMIT_MEMLOCK.
	ErrMemlock = errors.New("rdma: RLIMIT_MEMLOCK reached")
	// ErrMTU reports that no path MTU suits both ports.
	ErrMTU = errors.New("rdma: no common path MTU")
	// ErrBadOffer reports a peer offer that cannot be connected to.
	ErrBadOffer = errors.New("rdma: invalid peer offer")
	// ErrQPFailed reports a failed work completion: the queue pair is in ERROR
	// (transport retries exceeded, remote access error, flush...). The wrapped
	// *verbs.WCError says which.
	ErrQPFailed = errors.New("rdma: queue pair failed")
	// ErrControlLost reports that the bootstrap connection, kept as control channel,
	// closed or failed without the peer closing the stream: the peer process is gone.
	ErrControlLost = errors.New("rdma: control connection lost")
	// ErrKeepaliveTimeout reports that nothing arrived on the control channel for
	// three keepalive periods.
	ErrKeepaliveTimeout = errors.New("rdma: keepalive timeout")
	// ErrPeerClosed reports a Write after the peer closed the connection.
	ErrPeerClosed = errors.New("rdma: connection closed by peer")
	// ErrProtocol reports a peer that broke the flow-control protocol; the wrapped
	// flowctl error says how.
	ErrProtocol = errors.New("rdma: protocol violation by peer")
	// ErrCQFailed reports that the completion queue the connection shares failed.
	ErrCQFailed = errors.New("rdma: completion queue failed")
	// ErrDeviceFatal reports that the RDMA device raised a fatal asynchronous event
	// (IBV_EVENT_DEVICE_FATAL): every connection on it fails at once.
	ErrDeviceFatal = errors.New("rdma: device failed")
	// ErrPortDown reports that the connection's port left the active state
	// (IBV_EVENT_PORT_ERR: link down, netdev down): every connection on the port
	// fails at once.
	ErrPortDown = errors.New("rdma: port went down")
	// ErrLingerTimeout reports, from Close, that the peer did not acknowledge the bytes
	// written and the FIN within the linger time: they may be lost.
	ErrLingerTimeout = errors.New("rdma: linger time passed")
)
