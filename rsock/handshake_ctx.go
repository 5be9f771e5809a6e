package rsock

import (
	"context"
	"sync"
	"time"
)

// handshakeCtx is a parent context bounded by a deadline, as
// context.WithDeadline(parent, deadline) is, except that the timer and the Done channel
// are made only when something asks for Done. A handshake on a warm device never does:
// the bootstrap connection's deadline bounds its reads and writes, the engine checks
// Err, and the handshake's own waits select on the parent alone (see parentDone),
// bounded by timers shorter than the deadline. So a connection's setup does not pay
// for a timer it never needs.
//
// The zero value is not usable; init sets it up. It is not copied after init.
type handshakeCtx struct {
	parent   context.Context
	deadline time.Time

	mu     sync.Mutex
	made   context.Context // context.WithDeadline(parent, deadline), once Done was called
	cancel context.CancelFunc
}

// init bounds parent by deadline (or parent's own deadline, if earlier).
func (h *handshakeCtx) init(parent context.Context, deadline time.Time) {
	if d, ok := parent.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	h.parent, h.deadline = parent, deadline
}

// Deadline returns the handshake's deadline.
func (h *handshakeCtx) Deadline() (time.Time, bool) { return h.deadline, true }

// Value returns the parent's value for key.
func (h *handshakeCtx) Value(key any) any { return h.parent.Value(key) }

// Done returns a channel closed when the parent ends or the deadline passes. The first
// call makes it, with its timer; release stops that timer.
func (h *handshakeCtx) Done() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.made == nil {
		h.made, h.cancel = context.WithDeadline(h.parent, h.deadline)
	}
	return h.made.Done()
}

// Err returns the parent's error, else context.DeadlineExceeded once the deadline has
// passed, else nil; once Done was called, the error of the context it made.
func (h *handshakeCtx) Err() error {
	h.mu.Lock()
	made := h.made
	h.mu.Unlock()
	if made != nil {
		return made.Err()
	}
	if err := h.parent.Err(); err != nil {
		return err
	}
	if !time.Now().Before(h.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// release ends what Done made, if anything, as a context.CancelFunc does; the context
// is not used after it.
func (h *handshakeCtx) release() {
	h.mu.Lock()
	cancel := h.cancel
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// parentDone is what a handshake step waits on besides its own, shorter bound: for a
// handshakeCtx, its parent's Done (nil, never ready, for a parent that cannot end),
// which makes no timer; for any other ctx, ctx.Done(). A step may wait on it only where
// something else ends the wait by the handshake's deadline: a timer shorter than it, or
// a read on the bootstrap connection, whose deadline is the handshake's.
func parentDone(ctx context.Context) <-chan struct{} {
	if h, ok := ctx.(*handshakeCtx); ok {
		return h.parent.Done()
	}
	return ctx.Done()
}
