package rdma

import (
	"context"
	"time"
)

// stopCtx is a context that ends when the channel is closed: the context of a goroutine
// the engine starts and stops again and again as connections come and go (a poller's,
// a device's event listener), which a process that dials connection after connection
// does once per connection. context.WithCancel would do as well, with three
// allocations (the context, its cancel function and, once waited on, its channel)
// where a stopCtx makes one: the channel, which a context.Context interface holds
// without another.
type stopCtx chan struct{}

// newStopCtx returns a stopCtx that has not ended; close it to end it.
func newStopCtx() stopCtx { return make(stopCtx) }

// Deadline reports that a stopCtx has no deadline.
func (s stopCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done returns the channel itself, closed when the context ends.
func (s stopCtx) Done() <-chan struct{} { return s }

// Err returns context.Canceled once the channel is closed, else nil.
func (s stopCtx) Err() error {
	select {
	case <-s:
		return context.Canceled
	default:
		return nil
	}
}

// Value carries no values.
func (s stopCtx) Value(any) any { return nil }
