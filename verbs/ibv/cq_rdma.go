//go:build rdma && linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/verbs"
)

// pollBatch bounds the completions one ibv_poll_cq call moves; it sizes each CQ's
// C-side scratch arrays. Poll calls ibv_poll_cq again for bigger slices.
const pollBatch = 64

var (
	noDeadline   time.Time
	aLongTimeAgo = time.Unix(1, 0)

	errCQClosed      = fmt.Errorf("ibv: completion queue %w", verbs.ErrClosed)
	errCQOverflow    = fmt.Errorf("ibv: %w", verbs.ErrCQOverflow)
	errChannelClosed = fmt.Errorf("ibv: completion channel %w", verbs.ErrClosed)
)

// CreateCompChannel creates a completion channel whose fd is non-blocking and waited
// on through the netpoller.
func (ctx *devContext) CreateCompChannel() (verbs.CompChannel, error) {
	if err := ctx.addChild(); err != nil {
		return nil, fmt.Errorf("ibv: create comp channel: %w", err)
	}
	c, err := C.rsock_create_comp_channel(ctx.c)
	if c == nil {
		ctx.removeChild()
		return nil, errnoError("create comp channel", err, classCreate)
	}
	f, err := pollFile(int(C.rsock_comp_channel_fd(c)), "ibv-comp-channel")
	if err == nil {
		var rc syscall.RawConn
		if rc, err = f.SyscallConn(); err == nil {
			ch := &compChannel{
				ctx:     ctx,
				ch:      c,
				f:       f,
				rc:      rc,
				turn:    make(chan struct{}, 1),
				closing: make(chan struct{}),
			}
			ch.readFn = ch.readEvent
			ch.interruptFn = ch.interrupt
			return ch, nil
		}
		f.Close()
	}
	C.rsock_destroy_comp_channel(c)
	ctx.removeChild()
	return nil, fmt.Errorf("ibv: create comp channel: %w", err)
}

// compChannel implements verbs.CompChannel over an ibv_comp_channel.
type compChannel struct {
	ctx *devContext
	ch  *C.struct_ibv_comp_channel
	f   *os.File // a duplicate of the channel's fd, registered with the netpoller
	rc  syscall.RawConn

	// turn admits one Wait at a time (each event goes to one waiter, as with
	// ibv_get_cq_event) and lets Close wait out a Wait in progress. Holding it is
	// what entitles a Wait to the fields below and to the file's read deadline.
	turn    chan struct{}
	closing chan struct{} // closed by Close

	evCQ        *C.struct_ibv_cq
	evErr       error
	readFn      func(uintptr) bool // ch.readEvent, made once so Wait does not allocate it
	interruptFn func()             // ch.interrupt, likewise

	// The cancellation of the latest Wait's context stays registered after the Wait
	// returns: a poller waits again and again with one context, and registering anew
	// each time (context.AfterFunc) would allocate on every wait. watchDone is the
	// Done channel it watches; a Wait with another context replaces it, and Close
	// removes it. A cancellation that fires between Waits leaves a read deadline in
	// the past, which the next Wait clears (and a cancelled context fails that Wait
	// before it reads anyway).
	watchDone <-chan struct{}
	stopWatch func() bool

	mu       sync.Mutex // guards closed and attached against CreateCQ and Close
	closed   atomic.Bool
	attached int // CQs created on this channel and not yet closed
}

// Wait parks the goroutine in the netpoller until an armed CQ of this channel gets a
// completion, then acknowledges the event and returns the CQ. It holds no lock while
// parked; cancellation sets a read deadline in the past.
func (ch *compChannel) Wait(ctx context.Context) (verbs.CQ, error) {
	select {
	case ch.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-ch.closing:
		return nil, errChannelClosed
	}
	defer func() { <-ch.turn }()
	if ch.closed.Load() {
		return nil, errChannelClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if testHookWaitStarts != nil {
		testHookWaitStarts(ch)
	}
	if err := ch.f.SetReadDeadline(noDeadline); err != nil {
		return nil, fmt.Errorf("ibv: wait for completion event: %w", err)
	}
	if done := ctx.Done(); done != nil && done != ch.watchDone {
		if ch.stopWatch != nil {
			ch.stopWatch()
		}
		ch.watchDone, ch.stopWatch = done, context.AfterFunc(ctx, ch.interruptFn)
	}
	// A cancellation of a watched context whose interrupt ran between the look above
	// and the clearing of the deadline was erased by it, and the read below would park
	// for good (a poller's detach waited for it forever, once, in CI): look again, now
	// that an interrupt can only come after the clearing.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		ch.evCQ, ch.evErr = nil, nil
		if err := ch.rc.Read(ch.readFn); err != nil {
			switch {
			case ch.closed.Load():
				return nil, errChannelClosed
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, os.ErrDeadlineExceeded):
				// A cancellation of an earlier Wait landed late: clear it and go on.
				if err := ch.f.SetReadDeadline(noDeadline); err != nil {
					return nil, fmt.Errorf("ibv: wait for completion event: %w", err)
				}
				continue
			}
			return nil, fmt.Errorf("ibv: wait for completion event: %w", err)
		}
		if ch.evErr != nil {
			return nil, fmt.Errorf("ibv: get cq event: %w", ch.evErr)
		}
		// Look the CQ up before acknowledging: until the ack, ibv_destroy_cq waits,
		// so the address cannot belong to a newer CQ yet.
		c := ch.ctx.lookupCQ(uintptr(unsafe.Pointer(ch.evCQ)))
		C.rsock_ack_cq_events(ch.evCQ, 1)
		if c != nil {
			return c, nil
		}
		// The CQ is being closed; its event means nothing to anyone. Wait on.
	}
}

// readEvent is the RawConn.Read callback: it returns false (park in the netpoller)
// while no event is pending.
func (ch *compChannel) readEvent(uintptr) bool {
	for {
		cq, err := C.rsock_get_cq_event(ch.ch)
		if cq != nil {
			ch.evCQ = cq
			return true
		}
		switch err {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case nil:
			err = errors.New("ibv_get_cq_event failed without an errno")
		}
		ch.evErr = err
		return true
	}
}

func (ch *compChannel) interrupt() { ch.f.SetReadDeadline(aLongTimeAgo) }

// testHookWaitStarts, when a test sets it, runs in Wait after its first look at the
// context, before the deadline is cleared.
var testHookWaitStarts func(ch *compChannel)

func (ch *compChannel) attach() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed.Load() {
		return errChannelClosed
	}
	ch.attached++
	return nil
}

func (ch *compChannel) detach() {
	ch.mu.Lock()
	ch.attached--
	ch.mu.Unlock()
}

// Close wakes a Wait in progress (it returns ErrClosed), waits for it to leave, and
// destroys the channel. CQs created on the channel must be closed first.
func (ch *compChannel) Close() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed.Load() {
		return errChannelClosed
	}
	if ch.attached > 0 {
		return fmt.Errorf("ibv: destroy comp channel: %d CQs still use it: %w", ch.attached, verbs.ErrBusy)
	}
	ch.closed.Store(true)
	close(ch.closing)
	ch.f.Close()
	ch.turn <- struct{}{} // a Wait in progress has returned
	if ch.stopWatch != nil {
		ch.stopWatch()
		ch.watchDone, ch.stopWatch = nil, nil
	}
	rc, err := C.rsock_destroy_comp_channel(ch.ch)
	ch.ctx.removeChild()
	if rc != 0 {
		return errnoError("destroy comp channel", errnoOf(int(rc), err), classDestroy)
	}
	return nil
}

// CreateCQ creates a CQ of at least cqe entries, attached to ch if it is not nil, on
// completion vector vector (below DeviceAttr.NumCompVectors).
func (ctx *devContext) CreateCQ(cqe int, ch verbs.CompChannel, vector int) (verbs.CQ, error) {
	if cqe <= 0 {
		return nil, fmt.Errorf("ibv: create cq: %d entries: %w", cqe, verbs.ErrInvalidArgument)
	}
	if vector < 0 || vector >= max(ctx.attr.NumCompVectors, 1) {
		return nil, fmt.Errorf("ibv: create cq: completion vector %d of %d: %w", vector, ctx.attr.NumCompVectors, verbs.ErrInvalidArgument)
	}
	var channel *compChannel
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		c, ok := ch.(*compChannel)
		if !ok || c == nil || c.ctx != ctx {
			return nil, fmt.Errorf("ibv: create cq: completion channel of another device or provider: %w", verbs.ErrInvalidArgument)
		}
		channel, cch = c, c.ch
	}
	if err := ctx.addChild(); err != nil {
		return nil, fmt.Errorf("ibv: create cq: %w", err)
	}
	if channel != nil {
		if err := channel.attach(); err != nil {
			ctx.removeChild()
			return nil, fmt.Errorf("ibv: create cq: %w", err)
		}
	}
	fail := func(err error) (verbs.CQ, error) {
		if channel != nil {
			channel.detach()
		}
		ctx.removeChild()
		return nil, err
	}
	if err := vma.Reserve(cqMappings); err != nil {
		return fail(fmt.Errorf("ibv: create cq: %w", err))
	}
	ibcq, err := C.rsock_create_cq(ctx.c, C.int(cqe), cch, C.int(vector))
	if ibcq == nil {
		vma.Release(cqMappings)
		return fail(errnoError(fmt.Sprintf("create cq of %d entries", cqe), err, classCreate))
	}
	size := int(C.rsock_cq_size(ibcq))
	n := min(max(size, 1), pollBatch)
	sc := (*C.struct_rsock_cq)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_rsock_cq{}))))
	wc := (*C.struct_ibv_wc)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.struct_ibv_wc{}))))
	out := (*C.struct_rsock_wc)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.struct_rsock_wc{}))))
	if sc == nil || wc == nil || out == nil {
		C.free(unsafe.Pointer(sc))
		C.free(unsafe.Pointer(wc))
		C.free(unsafe.Pointer(out))
		C.rsock_destroy_cq(ibcq)
		vma.Release(cqMappings)
		return fail(fmt.Errorf("ibv: create cq: %w", verbs.ErrNoResources))
	}
	sc.cq, sc.max, sc.wc, sc.out = ibcq, C.int(n), wc, out
	c := &cq{
		ctx:      ctx,
		ch:       channel,
		c:        sc,
		key:      uintptr(unsafe.Pointer(ibcq)),
		out:      unsafe.Slice(out, n),
		capacity: size,
	}
	ctx.registerCQ(c)
	return c, nil
}

// cq implements verbs.CQ over an ibv_cq and its C-side polling arrays.
type cq struct {
	ctx *devContext
	ch  *compChannel
	c   *C.struct_rsock_cq
	key uintptr             // address of the ibv_cq, the registry key
	out []C.struct_rsock_wc // C memory: c.out[0:c.max]

	capacity int // ibv_cq.cqe

	mu       sync.Mutex // serializes Poll, ReqNotify and Close; never held while blocking
	closed   bool
	users    int         // CreateQP calls in progress that name this CQ
	overflow atomic.Bool // set by the async event reader on IBV_EVENT_CQ_ERR
}

// FilledOutside reports that the CQ is filled outside the process, by the device (or
// the kernel's Soft-RoCE), not by goroutines that runtime.Gosched would let run:
// rsock's engine spaces a spinner's yields by it (rsock/internal/rdma's pause).
func (c *cq) FilledOutside() bool { return true }

var _ interface{ FilledOutside() bool } = (*cq)(nil) // the method rsock's engine looks for

// FilledOnHost reports whether the CQ's device is the kernel's Soft-RoCE
// ([verbs.DeviceAttr.SoftRoCE]): its completions are then produced by this host's
// cores, by the kernel's packet processing, and a thread spinning on the CQ polls on
// without yielding its core, which measured faster there than yielding it
// (rsock/internal/rdma's pause).
func (c *cq) FilledOnHost() bool { return c.ctx.attr.SoftRoCE }

var _ interface{ FilledOnHost() bool } = (*cq)(nil) // the method rsock's engine looks for

// acquire keeps the CQ from being destroyed until release (CreateQP names it).
func (c *cq) acquire() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errCQClosed
	}
	c.users++
	return nil
}

func (c *cq) release() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
}

// Capacity returns how many completions the CQ holds: ibv_create_cq's cqe, which may
// exceed the size asked for (verbstest.CapacityReporter).
func (c *cq) Capacity() int { return c.capacity }

// Poll moves up to len(wc) completions into wc. It allocates nothing. A Poll of no
// completions reports an overflow too, so that one can be awaited without draining the CQ.
func (c *cq) Poll(wc []verbs.WorkCompletion) (int, error) {
	if len(wc) == 0 {
		if c.overflow.Load() {
			return 0, errCQOverflow
		}
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errCQClosed
	}
	if c.overflow.Load() {
		return 0, errCQOverflow
	}
	n := 0
	for n < len(wc) {
		want := min(len(wc)-n, len(c.out))
		got := int(C.rsock_poll_cq(c.c, C.int(want)))
		if got < 0 {
			return n, fmt.Errorf("ibv: poll cq: ibv_poll_cq returned %d", got)
		}
		for i := range got {
			// Field by field, every field: a composite literal was built aside and
			// copied, and the copy's wide loads stalled on the fields' narrow stores
			// (through the test double of libibverbs, 18-25 ns a completion polled
			// in batches of 32 against 13-18 this way).
			o, w := &c.out[i], &wc[n+i]
			w.WRID = uint64(o.wr_id)
			w.Status = verbs.WCStatus(o.status)
			w.Opcode = verbs.WCOpcode(o.opcode)
			w.VendorErr = uint32(o.vendor_err)
			w.ByteLen = uint32(o.byte_len)
			w.Imm = uint32(o.imm) // host order: rsock_poll_cq applied ntohl
			w.QPN = uint32(o.qp_num)
			w.SrcQP = uint32(o.src_qp)
			w.Flags = verbs.WCFlags(o.wc_flags) & verbs.WCWithImm
		}
		n += got
		if got < want {
			break // the CQ is empty (ibv_poll_cq(3))
		}
	}
	return n, nil
}

// ReqNotify arms the CQ (ibv_req_notify_cq).
func (c *cq) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errCQClosed
	}
	if c.overflow.Load() {
		return errCQOverflow
	}
	so := C.int(0)
	if solicitedOnly {
		so = 1
	}
	if rc := C.rsock_req_notify_cq(c.c.cq, so); rc != 0 {
		return errnoError("req notify cq", syscall.Errno(rc), classOther)
	}
	return nil
}

// Close destroys the CQ. libibverbs refuses (ErrBusy) while QPs use it.
func (c *cq) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errCQClosed
	}
	if c.users > 0 {
		return fmt.Errorf("ibv: destroy cq: a QP is being created on it: %w", verbs.ErrBusy)
	}
	// ibv_destroy_cq waits until every event of the CQ is acknowledged; Wait and the
	// async reader acknowledge without taking c.mu, so this cannot deadlock.
	if rc, err := C.rsock_destroy_cq(c.c.cq); rc != 0 {
		return errnoError("destroy cq", errnoOf(int(rc), err), classDestroy)
	}
	c.closed = true
	vma.Release(cqMappings)
	c.ctx.unregisterCQ(c.key, c)
	C.free(unsafe.Pointer(c.c.wc))
	C.free(unsafe.Pointer(c.c.out))
	C.free(unsafe.Pointer(c.c))
	c.c, c.out = nil, nil
	if c.ch != nil {
		c.ch.detach()
	}
	c.ctx.removeChild()
	return nil
}
