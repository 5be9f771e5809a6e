package verbs

import (
	"context"
	"errors"
	"fmt"
)

// Provider is one implementation of verbs: a set of devices that can be opened.
type Provider interface {
	// Name identifies the provider, e.g. "soft" or "ibv".
	Name() string
	// Devices lists the provider's devices with their attributes and ports.
	Devices() ([]DeviceAttr, error)
	// Open opens the named device.
	Open(device string) (Context, error)
}

// Context is an open device (ibv_context).
type Context interface {
	// Device returns the attributes of the open device.
	Device() DeviceAttr
	// QueryPort returns the current attributes of port num (1-based).
	QueryPort(num uint8) (PortAttr, error)
	// AllocPD allocates a protection domain.
	AllocPD() (PD, error)
	// CreateCompChannel creates a completion event channel.
	CreateCompChannel() (CompChannel, error)
	// CreateCQ creates a completion queue with room for at least cqe completions.
	// ch may be nil if the CQ will only be polled. vector is the completion vector
	// (interrupt) that signals it, from 0 to DeviceAttr.NumCompVectors-1: spreading
	// CQs over the vectors spreads their interrupts over the CPUs.
	CreateCQ(cqe int, ch CompChannel, vector int) (CQ, error)
	// WaitAsyncEvent returns the device's next asynchronous event (port state and GID
	// changes, fatal device, QP and CQ errors), already acknowledged, waiting while ctx
	// lasts; it parks only the calling goroutine. Events are queued from the opening
	// of the context (at most MaxQueuedAsyncEvents). It returns ctx.Err() when ctx
	// ends first, and an error wrapping ErrClosed once the context is closed.
	WaitAsyncEvent(ctx context.Context) (AsyncEvent, error)
	// Close releases the context. Resources created from it must be closed first.
	Close() error
}

// PD is a protection domain (ibv_pd): MRs and QPs created from one PD may be used together.
type PD interface {
	// RegMR allocates length bytes of memory suitable for DMA and registers it with the
	// given access rights. The memory is owned by the MR and released by MR.Close.
	RegMR(length int, access AccessFlags) (MR, error)
	// CreateQP creates a queue pair in the RESET state.
	CreateQP(attr QPInitAttr) (QP, error)
	// Close deallocates the protection domain.
	Close() error
}

// MR is a registered memory region (ibv_mr).
type MR interface {
	// Bytes returns the registered memory. It stays valid until Close.
	Bytes() []byte
	// Addr is the address of Bytes()[0] as the device sees it: SGEs and remote writes
	// name memory by Addr()+offset.
	Addr() uint64
	// LKey is the local key, used in SGEs.
	LKey() uint32
	// RKey is the remote key, handed to peers for RDMA READ and WRITE.
	RKey() uint32
	// Access returns the access rights the region was registered with.
	Access() AccessFlags
	// Close deregisters the region and frees its memory.
	Close() error
}

// CompChannel delivers notifications from armed CQs (ibv_comp_channel).
type CompChannel interface {
	// Wait blocks until a CQ attached to this channel that was armed with ReqNotify
	// receives a completion, and returns that CQ (the event is acknowledged). Waiting
	// parks only the calling goroutine. It returns ctx.Err() when ctx ends, and
	// ErrClosed after Close.
	Wait(ctx context.Context) (CQ, error)
	// Close closes the channel, unblocking Wait. CQs attached to it must be closed first.
	Close() error
}

// CQ is a completion queue (ibv_cq).
type CQ interface {
	// Poll moves up to len(wc) completions into wc and returns how many it moved.
	// It returns ErrCQOverflow once the queue has overflowed; the CQ is then unusable.
	Poll(wc []WorkCompletion) (int, error)
	// ReqNotify arms the CQ: the next completion added to it produces one event on its
	// completion channel. With solicitedOnly, only solicited or error completions do.
	ReqNotify(solicitedOnly bool) error
	// Close destroys the CQ. QPs using it must be destroyed first.
	Close() error
}

// QP is a reliable-connected queue pair (ibv_qp of type IBV_QPT_RC).
type QP interface {
	// QPN is the queue pair number the peer names in its RTR transition.
	QPN() uint32
	// State returns the QP's current state.
	State() QPState
	// ToInit moves the QP from RESET to INIT.
	ToInit(attr InitAttr) error
	// ToRTR moves the QP from INIT to ready-to-receive, connecting it to the peer.
	ToRTR(attr RTRAttr) error
	// ToRTS moves the QP from RTR to ready-to-send.
	ToRTS(attr RTSAttr) error
	// ToError moves the QP to ERROR; outstanding work requests are flushed.
	ToError() error
	// ToReset moves the QP back to RESET, discarding its queues without completions.
	ToReset() error
	// PostSend posts work requests to the send queue in order. On failure nothing from
	// the failing request on is posted, and the error is a *PostError naming it.
	PostSend(wr []SendWR) error
	// PostRecv posts receive requests, with the same failure rule as PostSend.
	PostRecv(wr []RecvWR) error
	// Close destroys the QP.
	Close() error
}

// QPQuerier is implemented by QPs that report the attributes a connected QP runs with
// (ibv_query_qp): how a caller checks what the device applied, such as the traffic
// class and service level of its address vector. Both providers implement it.
type QPQuerier interface {
	Query() (QPAttr, error)
}

// TransportCauser is implemented by QPs whose transport can fail for a local reason
// that a work completion's status cannot carry. verbs/shm's QP reaches its peer through
// a Unix socket, which a process out of file descriptors (EMFILE) cannot open: the
// request is then retried as a lost packet, and ends in WCRetryExcErr like one. A
// caller that sees that status asks TransportCause for the error behind it, to report
// "too many open files" rather than an unreachable peer. It returns nil when the QP's
// transport met no such error (the peer did not answer), and for the last error only.
type TransportCauser interface {
	TransportCause() error
}

// QPAttr is what [QPQuerier.Query] reports (a subset of struct ibv_qp_attr).
type QPAttr struct {
	State   QPState
	PathMTU MTU
	DestQPN uint32
	Dest    AddressVector // the address vector of the RTR transition, as applied
}

// PostError reports the first work request a post rejected (ibv's bad_wr).
type PostError struct {
	Index int   // index of the rejected request in the slice passed to the post call
	Err   error // why: ErrQueueFull, ErrInvalidState, ErrInvalidArgument...
}

func (e *PostError) Error() string { return fmt.Sprintf("verbs: post request %d: %v", e.Index, e.Err) }
func (e *PostError) Unwrap() error { return e.Err }

// Sentinel errors that callers branch on with errors.Is.
var (
	ErrNoDevice        = errors.New("no RDMA device")
	ErrNotSupported    = errors.New("operation not supported")
	ErrClosed          = errors.New("resource closed")
	ErrInvalidState    = errors.New("invalid QP state for this operation") // EINVAL from modify/post
	ErrInvalidArgument = errors.New("invalid argument")                    // EINVAL
	ErrQueueFull       = errors.New("work queue full")                     // ENOMEM from post
	ErrNoResources     = errors.New("out of resources")                    // ENOMEM from create/reg
	ErrCQOverflow      = errors.New("completion queue overflow")           // IBV_EVENT_CQ_ERR
	ErrBusy            = errors.New("resource in use")                     // EBUSY from destroy
)
