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
	"slices"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
)

// devContext implements verbs.Context over an ibv_context.
//
// It keeps registries from C object pointers to the Go objects, so that completion
// events (which name an ibv_cq) and async events (which name an ibv_cq or ibv_qp) can
// be routed to them. C keeps no pointer to Go: the registries are keyed by address.
type devContext struct {
	p    *provider
	c    *C.struct_ibv_context
	attr verbs.DeviceAttr

	// Async events (CQ overflow, QP fatal errors) are read by one goroutine through
	// the netpoller; ev is its C-allocated event buffer.
	async     *os.File
	asyncDone chan struct{}
	ev        *C.struct_ibv_async_event
	events    verbs.AsyncEventQueue // what WaitAsyncEvent hands out

	mu       sync.Mutex
	closed   bool
	children int // PDs, CQs and completion channels not yet closed, port queries in progress
	cqs      map[uintptr]*cq
	qps      map[uintptr]*qp
}

func newContext(p *provider, c *C.struct_ibv_context, name string) (*devContext, error) {
	attr, err := p.describe(c, name)
	if err != nil {
		C.rsock_close_device(c)
		return nil, err
	}
	ctx := &devContext{
		p:         p,
		c:         c,
		attr:      attr,
		asyncDone: make(chan struct{}),
		cqs:       make(map[uintptr]*cq),
		qps:       make(map[uintptr]*qp),
	}
	f, err := pollFile(int(C.rsock_async_fd(c)), "ibv-async-"+name)
	if err != nil {
		C.rsock_close_device(c)
		return nil, fmt.Errorf("ibv: open device %s: async event fd: %w", name, err)
	}
	ctx.async = f
	ctx.ev = (*C.struct_ibv_async_event)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_ibv_async_event{}))))
	if ctx.ev == nil {
		f.Close()
		C.rsock_close_device(c)
		return nil, fmt.Errorf("ibv: open device %s: %w", name, verbs.ErrNoResources)
	}
	go ctx.readAsyncEvents()
	return ctx, nil
}

// Device returns the attributes read when the device was opened.
func (ctx *devContext) Device() verbs.DeviceAttr {
	a := ctx.attr
	a.Ports = slices.Clone(a.Ports)
	for i := range a.Ports {
		a.Ports[i].GIDs = slices.Clone(a.Ports[i].GIDs)
	}
	return a
}

// QueryPort queries the port now, with its current GID table.
func (ctx *devContext) QueryPort(num uint8) (verbs.PortAttr, error) {
	if num == 0 || int(num) > len(ctx.attr.Ports) {
		return verbs.PortAttr{}, fmt.Errorf("ibv: query port %d of %s: %w", num, ctx.attr.Name, verbs.ErrInvalidArgument)
	}
	// Counting the query as a child keeps Close away without holding ctx.mu across it.
	if err := ctx.addChild(); err != nil {
		return verbs.PortAttr{}, fmt.Errorf("ibv: query port: %w", err)
	}
	defer ctx.removeChild()
	return queryPort(ctx.c, ctx.attr.Name, num, len(ctx.attr.Ports))
}

// AllocPD allocates a protection domain.
func (ctx *devContext) AllocPD() (verbs.PD, error) {
	if err := ctx.addChild(); err != nil {
		return nil, fmt.Errorf("ibv: alloc pd: %w", err)
	}
	p, err := C.rsock_alloc_pd(ctx.c)
	if p == nil {
		ctx.removeChild()
		return nil, errnoError("alloc pd", err, classCreate)
	}
	return &pd{ctx: ctx, pd: p}, nil
}

// Close closes the device. Every PD, CQ and completion channel must be closed first.
func (ctx *devContext) Close() error {
	ctx.mu.Lock()
	if ctx.closed {
		ctx.mu.Unlock()
		return fmt.Errorf("ibv: close device: %w", verbs.ErrClosed)
	}
	if ctx.children > 0 {
		n := ctx.children
		ctx.mu.Unlock()
		return fmt.Errorf("ibv: close device %s: %d resources still open: %w", ctx.attr.Name, n, verbs.ErrBusy)
	}
	ctx.closed = true
	ctx.mu.Unlock()

	// Stop the async event reader before the context goes away.
	ctx.async.Close()
	<-ctx.asyncDone
	ctx.events.Close()
	C.free(unsafe.Pointer(ctx.ev))
	ctx.ev = nil
	if rc, err := C.rsock_close_device(ctx.c); rc != 0 {
		return errnoError("close device "+ctx.attr.Name, err, classDestroy)
	}
	return nil
}

func (ctx *devContext) addChild() error {
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	if ctx.closed {
		return verbs.ErrClosed
	}
	ctx.children++
	return nil
}

func (ctx *devContext) removeChild() {
	ctx.mu.Lock()
	ctx.children--
	ctx.mu.Unlock()
}

func (ctx *devContext) registerCQ(c *cq) {
	ctx.mu.Lock()
	ctx.cqs[uintptr(unsafe.Pointer(c.c.cq))] = c
	ctx.mu.Unlock()
}

// unregisterCQ removes c, unless the address has been reused by a newer CQ already.
func (ctx *devContext) unregisterCQ(key uintptr, c *cq) {
	ctx.mu.Lock()
	if ctx.cqs[key] == c {
		delete(ctx.cqs, key)
	}
	ctx.mu.Unlock()
}

func (ctx *devContext) lookupCQ(key uintptr) *cq {
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	return ctx.cqs[key]
}

func (ctx *devContext) registerQP(q *qp) {
	ctx.mu.Lock()
	ctx.qps[uintptr(unsafe.Pointer(q.qp))] = q
	ctx.mu.Unlock()
}

func (ctx *devContext) unregisterQP(key uintptr, q *qp) {
	ctx.mu.Lock()
	if ctx.qps[key] == q {
		delete(ctx.qps, key)
	}
	ctx.mu.Unlock()
}

// readAsyncEvents runs until Close: it reads the context's async events through the
// netpoller, applies the ones this package reports (CQ overflow, QP errors), and
// acknowledges each after applying it, so that a CQ or QP cannot be destroyed (and
// its address reused) between the event and its lookup.
func (ctx *devContext) readAsyncEvents() {
	defer close(ctx.asyncDone)
	rc, err := ctx.async.SyscallConn()
	if err != nil {
		return
	}
	for {
		var (
			typ    C.int
			getErr error
		)
		err := rc.Read(func(uintptr) bool {
			for {
				typ, getErr = C.rsock_get_async_event(ctx.c, ctx.ev)
				if typ >= 0 {
					getErr = nil
					return true
				}
				if errors.Is(getErr, syscall.EINTR) {
					continue
				}
				return !errors.Is(getErr, syscall.EAGAIN)
			}
		})
		if err != nil {
			return // closed
		}
		if getErr != nil {
			// The async fd fails only when the device is gone (unplugged, driver
			// unloaded): say so to WaitAsyncEvent, as the kernel's DEVICE_FATAL would.
			ctx.events.Push(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
			return
		}
		ctx.events.Push(ctx.apply(typ, uintptr(C.rsock_async_element(ctx.ev))))
		C.rsock_ack_async_event(ctx.ev)
	}
}

// apply records what an async event means for the CQ or QP it names, and returns the
// event as WaitAsyncEvent reports it. It runs before the event is acknowledged, so
// the CQ or QP it names is still the one the event is about.
func (ctx *devContext) apply(typ C.int, element uintptr) verbs.AsyncEvent {
	e := verbs.AsyncEvent{Type: verbs.AsyncEventType(typ)}
	switch {
	case typ == C.IBV_EVENT_CQ_ERR:
		// ibv_poll_cq(3): a CQ overrun raises IBV_EVENT_CQ_ERR and the CQ is unusable.
		if c := ctx.lookupCQ(element); c != nil {
			c.overflow.Store(true)
			e.CQ = c
		}
	case e.Type.QPEvent():
		ctx.mu.Lock()
		q := ctx.qps[element]
		ctx.mu.Unlock()
		if q == nil {
			break
		}
		e.QPN = q.qpn
		switch typ {
		case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR:
			q.state.Store(int32(verbs.QPStateError))
		}
	case e.Type.PortEvent():
		e.Port = uint8(element)
	}
	return e
}

// WaitAsyncEvent returns the device's next asynchronous event. The events are read,
// applied (see apply) and acknowledged by the context's reader goroutine, which waits
// on the async fd through the netpoller, and queued here.
func (ctx *devContext) WaitAsyncEvent(c context.Context) (verbs.AsyncEvent, error) {
	e, err := ctx.events.Wait(c)
	if err != nil && errors.Is(err, verbs.ErrClosed) {
		return e, fmt.Errorf("ibv: %s: %w", ctx.attr.Name, err)
	}
	return e, err // c.Err() as is, as verbs asks: a wait ended on purpose builds no error
}

// pollFile returns a pollable *os.File for fd, a descriptor owned by libibverbs: it
// sets O_NONBLOCK on fd's open file description and hands a duplicate of fd to the
// netpoller. Closing the returned file leaves fd open for libibverbs to close.
func pollFile(fd int, name string) (*os.File, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("set O_NONBLOCK: %w", err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
			return nil, fmt.Errorf("dup: %w (%w)", verbs.ErrNoResources, err)
		}
		return nil, fmt.Errorf("dup: %w", err)
	}
	f := os.NewFile(uintptr(dup), name)
	// A file the netpoller could not take silently falls back to blocking reads;
	// it is the one kind that cannot have a deadline.
	if err := f.SetReadDeadline(noDeadline); err != nil {
		f.Close()
		return nil, fmt.Errorf("not pollable: %w", err)
	}
	return f, nil
}
