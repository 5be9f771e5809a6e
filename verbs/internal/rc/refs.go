package rc

import (
	"sync"

	"github.com/rsockio/rsock/verbs"
)

// Refs tracks whether an object is closed and how many objects created from it are
// alive, so that closing an object still in use fails with [verbs.ErrBusy], as
// destroying a PD with registered MRs or a CQ with attached QPs fails with EBUSY.
// The zero value is an open object with no dependents.
type Refs struct {
	mu     sync.Mutex
	closed bool
	n      int
}

// PD is the core of a protection domain: its MRs and QPs, counted. A region and a QP
// belong to the same PD when they name the same PD core, by its address.
type PD struct{ Refs }

// Acquire records a new dependent object, or fails with [verbs.ErrClosed] if the object
// is closed.
func (r *Refs) Acquire() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return verbs.ErrClosed
	}
	r.n++
	return nil
}

// Release records that a dependent object is gone.
func (r *Refs) Release() {
	r.mu.Lock()
	r.n--
	r.mu.Unlock()
}

// Close marks the object closed, unless it is already closed ([verbs.ErrClosed]) or
// still has dependents ([verbs.ErrBusy]).
func (r *Refs) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return verbs.ErrClosed
	}
	if r.n > 0 {
		return verbs.ErrBusy
	}
	r.closed = true
	return nil
}
