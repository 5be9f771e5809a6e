package verbs

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// AsyncEventType is the kind of an asynchronous event (enum ibv_event_type), numbered
// as libibverbs numbers them.
type AsyncEventType int

// The asynchronous events. QP events name a QP (AsyncEvent.QPN), CQ events a CQ
// (AsyncEvent.CQ), port events a port (AsyncEvent.Port); EventDeviceFatal names the
// device as a whole.
const (
	EventCQErr            AsyncEventType = 0  // IBV_EVENT_CQ_ERR: the CQ overran and is unusable
	EventQPFatal          AsyncEventType = 1  // IBV_EVENT_QP_FATAL: the QP is in ERROR
	EventQPReqErr         AsyncEventType = 2  // IBV_EVENT_QP_REQ_ERR: invalid request; the QP is in ERROR
	EventQPAccessErr      AsyncEventType = 3  // IBV_EVENT_QP_ACCESS_ERR: access violation; the QP is in ERROR
	EventCommEst          AsyncEventType = 4  // IBV_EVENT_COMM_EST: first packet received in RTR
	EventSQDrained        AsyncEventType = 5  // IBV_EVENT_SQ_DRAINED
	EventPathMig          AsyncEventType = 6  // IBV_EVENT_PATH_MIG
	EventPathMigErr       AsyncEventType = 7  // IBV_EVENT_PATH_MIG_ERR
	EventDeviceFatal      AsyncEventType = 8  // IBV_EVENT_DEVICE_FATAL: the device is unusable
	EventPortActive       AsyncEventType = 9  // IBV_EVENT_PORT_ACTIVE: the port became active
	EventPortErr          AsyncEventType = 10 // IBV_EVENT_PORT_ERR: the port left the active state
	EventLIDChange        AsyncEventType = 11 // IBV_EVENT_LID_CHANGE
	EventPKeyChange       AsyncEventType = 12 // IBV_EVENT_PKEY_CHANGE
	EventSMChange         AsyncEventType = 13 // IBV_EVENT_SM_CHANGE
	EventSRQErr           AsyncEventType = 14 // IBV_EVENT_SRQ_ERR
	EventSRQLimitReached  AsyncEventType = 15 // IBV_EVENT_SRQ_LIMIT_REACHED
	EventQPLastWQEReached AsyncEventType = 16 // IBV_EVENT_QP_LAST_WQE_REACHED
	EventClientReregister AsyncEventType = 17 // IBV_EVENT_CLIENT_REREGISTER
	EventGIDChange        AsyncEventType = 18 // IBV_EVENT_GID_CHANGE: a GID table entry changed
	EventWQFatal          AsyncEventType = 19 // IBV_EVENT_WQ_FATAL
)

var asyncEventNames = [...]string{
	"CQ error", "QP fatal", "QP request error", "QP access error", "communication established",
	"SQ drained", "path migrated", "path migration error", "device fatal", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ error", "SRQ limit reached",
	"last WQE reached", "client reregistration", "GID change", "WQ fatal",
}

// String returns the description ibv_event_type_str gives, in lower case.
func (t AsyncEventType) String() string {
	if t >= 0 && int(t) < len(asyncEventNames) {
		return asyncEventNames[t]
	}
	return fmt.Sprintf("AsyncEventType(%d)", int(t))
}

// PortEvent reports whether events of this type name a port.
func (t AsyncEventType) PortEvent() bool {
	switch t {
	case EventPortActive, EventPortErr, EventLIDChange, EventPKeyChange, EventSMChange,
		EventClientReregister, EventGIDChange:
		return true
	}
	return false
}

// QPEvent reports whether events of this type name a QP.
func (t AsyncEventType) QPEvent() bool {
	switch t {
	case EventQPFatal, EventQPReqErr, EventQPAccessErr, EventCommEst, EventSQDrained,
		EventPathMig, EventPathMigErr, EventQPLastWQEReached:
		return true
	}
	return false
}

// AsyncEvent is one asynchronous event of an open device (struct ibv_async_event), as
// [Context.WaitAsyncEvent] returns it, already acknowledged.
type AsyncEvent struct {
	Type AsyncEventType
	Port uint8  // the port, for port events
	QPN  uint32 // the QP's number, for QP events
	CQ   CQ     // the CQ, for EventCQErr (nil if it was destroyed meanwhile)
}

func (e AsyncEvent) String() string {
	switch {
	case e.Type.PortEvent():
		return fmt.Sprintf("%v on port %d", e.Type, e.Port)
	case e.Type.QPEvent():
		return fmt.Sprintf("%v on QP %#x", e.Type, e.QPN)
	}
	return e.Type.String()
}

// MaxQueuedAsyncEvents bounds the events a Context keeps for WaitAsyncEvent. When
// nobody waits and more arrive, the oldest are dropped, except EventDeviceFatal, which
// is kept: a device that went fatal stays so.
const MaxQueuedAsyncEvents = 256

// AsyncEventQueue holds a Context's asynchronous events until WaitAsyncEvent takes
// them. Providers embed one: the zero value is ready, Push never blocks, and Wait parks
// only the calling goroutine. It keeps at most MaxQueuedAsyncEvents events.
type AsyncEventQueue struct {
	mu     sync.Mutex
	events []AsyncEvent
	closed bool
	wake   chan struct{} // cap 1: a token when events may be non-empty or closed is set
}

func (q *AsyncEventQueue) wakeLocked() chan struct{} {
	if q.wake == nil {
		q.wake = make(chan struct{}, 1)
	}
	return q.wake
}

// Push queues e for Wait. When the queue is full, the oldest event that is not
// EventDeviceFatal is dropped.
func (q *AsyncEventQueue) Push(e AsyncEvent) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if len(q.events) >= MaxQueuedAsyncEvents {
		drop := slices.IndexFunc(q.events, func(e AsyncEvent) bool { return e.Type != EventDeviceFatal })
		if drop < 0 {
			return // full of fatal events: one more says nothing new
		}
		q.events = slices.Delete(q.events, drop, drop+1)
	}
	q.events = append(q.events, e)
	select {
	case q.wakeLocked() <- struct{}{}:
	default:
	}
}

// Wait returns the oldest queued event, waiting for one while ctx lasts. It returns
// ctx.Err() when ctx ends first, and an error wrapping ErrClosed after Close.
func (q *AsyncEventQueue) Wait(ctx context.Context) (AsyncEvent, error) {
	for {
		q.mu.Lock()
		if q.closed {
			select { // pass the wake-up on to the next waiter
			case q.wakeLocked() <- struct{}{}:
			default:
			}
			q.mu.Unlock()
			return AsyncEvent{}, fmt.Errorf("wait for async event: %w", ErrClosed)
		}
		wake := q.wakeLocked()
		if len(q.events) > 0 {
			e := q.events[0]
			q.events[0] = AsyncEvent{}
			q.events = q.events[1:]
			if len(q.events) > 0 { // another waiter may be parked on the consumed token
				select {
				case wake <- struct{}{}:
				default:
				}
			} else {
				q.events = nil
			}
			q.mu.Unlock()
			return e, nil
		}
		q.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return AsyncEvent{}, ctx.Err()
		}
	}
}

// Close wakes every Wait, which then returns ErrClosed, and drops the queued events.
func (q *AsyncEventQueue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.events = nil
	select {
	case q.wakeLocked() <- struct{}{}:
	default:
	}
}
