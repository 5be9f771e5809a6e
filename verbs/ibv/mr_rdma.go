//go:build rdma && linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/verbs"
)

// The memory mappings a region, a QP and a CQ count against rsock's share of the
// process's limit (vm.max_map_count; internal/vma), so that registrations and
// queues are refused, and connections fall back, before the Go runtime's own next mmap
// is: a region is one mapping of ours; a QP's send and receive queues and a CQ's
// entries are mapped by some providers (rxe maps each from the kernel), so a QP counts
// two and a CQ one. TestMappingsCounted checks them against /proc/self/maps on the
// device the tests run on.
const (
	mrMappings = 1
	qpMappings = 2
	cqMappings = 1
)

// pd implements verbs.PD over an ibv_pd.
type pd struct {
	ctx *devContext
	pd  *C.struct_ibv_pd

	mu     sync.Mutex // guards closed and users; never held across a libibverbs call
	closed bool
	users  int // RegMR and CreateQP calls in progress
}

// Close deallocates the protection domain. libibverbs refuses (ErrBusy) while MRs or
// QPs of it are open.
func (p *pd) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("ibv: dealloc pd: %w", verbs.ErrClosed)
	}
	if p.users > 0 {
		return fmt.Errorf("ibv: dealloc pd: a registration or QP creation is in progress: %w", verbs.ErrBusy)
	}
	if rc, err := C.rsock_dealloc_pd(p.pd); rc != 0 {
		return errnoError("dealloc pd", errnoOf(int(rc), err), classDestroy)
	}
	p.closed = true
	p.ctx.removeChild()
	return nil
}

// acquire keeps the PD from being deallocated until release, without holding a lock
// across the call that uses it (registration can take a while: it pins the pages).
func (p *pd) acquire(op string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("ibv: %s: protection domain %w", op, verbs.ErrClosed)
	}
	p.users++
	return nil
}

func (p *pd) release() {
	p.mu.Lock()
	p.users--
	p.mu.Unlock()
}

const validAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

// RegMR maps length bytes of anonymous memory, excludes them from fork
// (MADV_DONTFORK, so a child's copy-on-write cannot move pages under the device), and
// registers them. The memory never comes from the Go heap.
func (p *pd) RegMR(length int, access verbs.AccessFlags) (verbs.MR, error) {
	if length <= 0 {
		return nil, fmt.Errorf("ibv: reg mr: length %d: %w", length, verbs.ErrInvalidArgument)
	}
	if access&^validAccess != 0 {
		return nil, fmt.Errorf("ibv: reg mr: access flags %#x: %w", uint32(access), verbs.ErrInvalidArgument)
	}
	// ibv_reg_mr(3): remote write requires local write.
	if access&verbs.AccessRemoteWrite != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("ibv: reg mr: remote write without local write: %w", verbs.ErrInvalidArgument)
	}
	if err := p.acquire("reg mr"); err != nil {
		return nil, err
	}
	defer p.release()
	page := os.Getpagesize()
	size := (length + page - 1) / page * page
	if err := vma.Reserve(mrMappings); err != nil {
		return nil, fmt.Errorf("ibv: reg mr of %d bytes: %w", length, err)
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		vma.Release(mrMappings)
		return nil, errnoError(fmt.Sprintf("reg mr: mmap %d bytes", size), err, classCreate)
	}
	unmap := func() {
		unix.Munmap(mem)
		vma.Release(mrMappings)
	}
	if err := unix.Madvise(mem, unix.MADV_DONTFORK); err != nil {
		unmap()
		return nil, fmt.Errorf("ibv: reg mr: madvise(MADV_DONTFORK): %w", err)
	}
	// mem is mmap'ed, not Go memory: libibverbs may keep its address.
	r, err := C.rsock_reg_mr(p.pd, unsafe.Pointer(&mem[0]), C.size_t(length), C.int(access))
	if r == nil {
		unmap()
		return nil, errnoError(fmt.Sprintf("reg mr of %d bytes", length), err, classCreate)
	}
	return &mr{
		pd:     p,
		mr:     r,
		mem:    mem,
		buf:    mem[:length:length],
		addr:   uint64(uintptr(r.addr)),
		lkey:   uint32(r.lkey),
		rkey:   uint32(r.rkey),
		access: access,
	}, nil
}

// mr implements verbs.MR over an ibv_mr and the mapping it registers.
type mr struct {
	pd     *pd
	mr     *C.struct_ibv_mr
	mem    []byte          // the whole mapping, as unix.Munmap wants it; nil for the caller's memory
	pin    *runtime.Pinner // the caller's memory (RegMemory), pinned while registered; else nil
	buf    []byte          // the registered bytes
	addr   uint64
	lkey   uint32
	rkey   uint32
	access verbs.AccessFlags

	mu     sync.Mutex
	closed bool
}

func (m *mr) Bytes() []byte             { return m.buf }
func (m *mr) Addr() uint64              { return m.addr }
func (m *mr) LKey() uint32              { return m.lkey }
func (m *mr) RKey() uint32              { return m.rkey }
func (m *mr) Access() verbs.AccessFlags { return m.access }

// Close deregisters the region, then unmaps its memory, or for the caller's memory
// (RegMemory) unpins it. If deregistration fails, the memory stays mapped or pinned: the
// device may still hold it.
func (m *mr) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("ibv: dereg mr: %w", verbs.ErrClosed)
	}
	if rc, err := C.rsock_dereg_mr(m.mr); rc != 0 {
		return errnoError("dereg mr", errnoOf(int(rc), err), classDestroy)
	}
	m.closed = true
	m.buf = nil
	if m.pin != nil {
		m.pin.Unpin()
		return nil
	}
	if err := unix.Munmap(m.mem); err != nil {
		return fmt.Errorf("ibv: dereg mr: munmap: %w", err)
	}
	m.mem = nil
	vma.Release(mrMappings)
	return nil
}
