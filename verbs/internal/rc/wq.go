package rc

import "github.com/rsockio/rsock/verbs"

// RecvWQE is a posted receive work request.
type RecvWQE struct {
	ID  uint64
	SGL []verbs.SGE // its part of the queue's SGL storage, a copy of the WR's
}

// RecvQueue is the core of a QP's receive queue: the receive WQEs posted and not yet
// completed, oldest first, with their SGLs copied into storage of its own, and the count
// of WQEs ever posted. A WQE's slot is released when its completion is polled, not when
// it completes: the slots in use are those posted minus those released (InUse). The
// provider guards it with its receive-queue lock.
type RecvQueue struct {
	ring    []RecvWQE
	sges    []verbs.SGE // maxSGE per slot
	maxSGE  int
	head, n int
	posted  uint64
}

// Init makes r an empty queue of maxWR WQEs of up to maxSGE SGEs each, whose SGLs are
// kept in sges (maxWR×maxSGE long) or, if sges is nil, in storage Init allocates.
func (r *RecvQueue) Init(maxWR, maxSGE int, sges []verbs.SGE) {
	if sges == nil {
		sges = make([]verbs.SGE, maxWR*maxSGE)
	}
	r.ring, r.sges, r.maxSGE = make([]RecvWQE, maxWR), sges, maxSGE
}

// InUse returns how many slots are in use when released slots have been released by
// polled completions.
func (r *RecvQueue) InUse(released uint64) uint64 { return r.posted - released }

// Post adds WR w, which the caller has checked (CheckPostRecv: the queue has room, the
// SGL fits), behind the WQEs posted before it. The queue keeps a copy of its SGL.
func (r *RecvQueue) Post(w *verbs.RecvWR) {
	r.posted++
	i := r.head + r.n
	if i >= len(r.ring) {
		i -= len(r.ring)
	}
	k := i * r.maxSGE
	e := &r.ring[i]
	e.ID, e.SGL = w.ID, r.sges[k:k+len(w.SGL):k+len(w.SGL)]
	copy(e.SGL, w.SGL)
	r.n++
}

// Len returns how many WQEs are posted and not yet completed.
func (r *RecvQueue) Len() int { return r.n }

// Head returns the oldest WQE not yet completed; the queue must not be empty.
func (r *RecvQueue) Head() *RecvWQE { return &r.ring[r.head] }

// Pop removes the head WQE, which has completed. Its slot is left as it is until a Post
// reuses it: a WQE holds only an ID and a view of the queue's own SGL storage, so a
// stale one keeps nothing alive.
func (r *RecvQueue) Pop() {
	r.head++
	if r.head == len(r.ring) {
		r.head = 0
	}
	r.n--
}

// Discard removes every WQE without completions, as resetting or destroying a QP does.
func (r *RecvQueue) Discard() {
	clear(r.ring)
	r.head, r.n = 0, 0
}

// Reset discards every WQE and accounts every slot as free: released is the count of
// slots released so far, and no later poll releases any (the caller has removed the
// QP's completions from its CQ).
func (r *RecvQueue) Reset(released uint64) {
	r.Discard()
	r.posted = released
}
