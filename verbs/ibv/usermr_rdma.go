//go:build rdma && linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/rsockio/rsock/verbs"
)

var _ verbs.MemoryRegistrar = (*pd)(nil)

// RegMemory registers buf, memory the caller owns (Go heap memory, typically the
// buffer an application passed to Write), with ibv_reg_mr: it implements
// [verbs.MemoryRegistrar]. The kernel pins buf's pages for the device, counted against
// RLIMIT_MEMLOCK like RegMR's (see [provider.PinsMemory]).
//
// libibverbs keeps buf's address in the ibv_mr, in C memory, for as long as the region
// is registered, which cgo allows only for pinned Go memory: the region pins buf with a
// [runtime.Pinner] until Close, so that the garbage collector neither frees it nor
// hands its pages back to the kernel while the device may read it (Go's heap does not
// move objects; pinning is what makes the address a promise). The region holds the
// only Pinner: the caller must Close it, as any MR.
//
// Unlike RegMR's memory, buf is not excluded from fork: MADV_DONTFORK applies to whole
// pages, which buf shares with other Go objects. None is needed: Go starts children
// with vfork semantics (os/exec), which share no page copy-on-write, and since Linux 5.9
// a fork copies pinned pages into the child at once, so the parent's stay the device's.
//
// Close deregisters the region and unpins buf; it frees nothing.
func (p *pd) RegMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("ibv: register memory: empty buffer: %w", verbs.ErrInvalidArgument)
	}
	if access&^validAccess != 0 {
		return nil, fmt.Errorf("ibv: register memory: access flags %#x: %w", uint32(access), verbs.ErrInvalidArgument)
	}
	if access&verbs.AccessRemoteWrite != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("ibv: register memory: remote write without local write: %w", verbs.ErrInvalidArgument)
	}
	if err := p.acquire("register memory"); err != nil {
		return nil, err
	}
	defer p.release()
	m := &mr{pd: p, pin: new(runtime.Pinner), buf: buf[:len(buf):len(buf)], access: access}
	base := unsafe.Pointer(unsafe.SliceData(buf))
	m.pin.Pin(base)
	r, err := C.rsock_reg_mr(p.pd, base, C.size_t(len(buf)), C.int(access))
	if r == nil {
		m.pin.Unpin()
		return nil, errnoError(fmt.Sprintf("register %d bytes of memory", len(buf)), err, classCreate)
	}
	m.mr = r
	m.addr = uint64(uintptr(r.addr))
	m.lkey = uint32(r.lkey)
	m.rkey = uint32(r.rkey)
	return m, nil
}
