package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// MR is a registered memory region. It implements [verbs.MR].
//
// Its memory is a memfd mapped shared, sealed against shrinking and growing so that a
// peer that maps it can never fault on a truncated file. A peer QP whose requests name
// the region's rkey gets the descriptor (read-only when the region grants remote read
// only) and maps it; RDMA WRITE and READ then copy straight into and out of it. Addr is
// the address of the mapping in this process. A region of the caller's own memory
// (RegLocalMemory) has no memfd, and only this process's work requests name it.
type MR struct {
	pd     *PD
	dev    *device
	fd     int       // -1: the caller's memory (RegLocalMemory)
	mem    []byte    // the whole mapping, whole pages; nil for the caller's memory
	reg    rc.Region // mem[:length], its address here and access rights, as the RC core checks them
	key    uint32
	closed atomic.Bool
}

// RegMR allocates length bytes of shared memory and registers them. As ibv_reg_mr(3)
// requires, remote write access needs local write access too.
func (p *PD) RegMR(length int, access verbs.AccessFlags) (verbs.MR, error) {
	if err := provider.CheckRegMR(length, maxRegionSize, access); err != nil {
		return nil, err
	}
	return p.register("register MR", maxMR, fullMR, access, func(m *MR) error {
		fd, mem, err := newSharedMemory(length, nil)
		if err != nil {
			return fmt.Errorf("%d bytes: %w: %w", length, verbs.ErrNoResources, err)
		}
		m.fd, m.mem = fd, mem
		m.reg.Buf, m.reg.Addr = mem[:length:length], addressOf(mem)
		return nil
	}, p.ctx.dev.mrs.Insert) // never reused: a stale key names nothing
}

var _ verbs.LocalMemoryRegistrar = (*PD)(nil)

// RegLocalMemory registers buf, memory the caller owns, for this process's own work
// requests: it implements [verbs.LocalMemoryRegistrar]. A peer can map only a memfd
// (RegMR's regions), so remote access is refused; but a requester copies an RDMA
// WRITE's or a send's payload from its local SGEs itself, and a responder copies a
// received message into its receive WQE's, so any memory of this process serves there.
// The region's Bytes is buf: Close deregisters it, waiting for a copy under way as
// RegMR's regions do, and leaves buf alone. It counts against the device's MR limit
// like RegMR's regions, but takes none of its last quarter (maxLocalMR): a caller can
// do without these (it copies instead), but not without the regions a connection needs.
func (p *PD) RegLocalMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	if err := provider.CheckRegMR(len(buf), maxRegionSize, access); err != nil {
		return nil, err
	}
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteRead) != 0 {
		return nil, fmt.Errorf("shm: register memory: remote access to memory not shared with peers: %w", verbs.ErrInvalidArgument)
	}
	if buf == nil {
		buf = []byte{}
	}
	return p.register("register memory", maxLocalMR, fullLocalMR, access, func(m *MR) error {
		m.reg.Buf, m.reg.Addr = buf[:len(buf):len(buf)], addressOf(buf)
		return nil
	}, p.ctx.dev.mrs.InsertLocal) // no peer ever holds its key (regionFor refuses it): reused
}

// register is the sequence RegMR and RegLocalMemory share, each step undone if a later
// one fails: an injected failure, an MR of the device's (at most limit of them, else
// the error says full), a reference to p, the region's memory (place sets it and, for
// memory of its own, fd and mem), and the region's key from insert. op names the
// operation in errors.
func (p *PD) register(op string, limit int, full string, access verbs.AccessFlags,
	place func(*MR) error, insert func(*rc.Region) (uint32, error)) (verbs.MR, error) {
	d := p.ctx.dev
	if err := d.p.injectedFailure(allocMR); err != nil {
		return nil, fmt.Errorf("shm: %s: %w", op, err)
	}
	if !reserve(&d.nMR, limit) {
		return nil, fmt.Errorf("shm: %s: %s: %w", op, full, verbs.ErrNoResources)
	}
	if err := p.refs.Acquire(); err != nil {
		d.nMR.Add(-1)
		return nil, fmt.Errorf("shm: %s: %w", op, err)
	}
	m := &MR{pd: p, dev: d, fd: -1, reg: rc.Region{PD: &p.refs, Access: access}}
	m.reg.Owner = m
	err := place(m)
	if err == nil {
		if m.key, err = insert(&m.reg); err != nil {
			m.free()
		}
	}
	if err != nil {
		p.refs.Release()
		d.nMR.Add(-1)
		return nil, fmt.Errorf("shm: %s: %w", op, err)
	}
	return m, nil
}

// addressOf returns the address of b's first byte in this process.
func addressOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// free releases the memory RegMR made for m; the caller's memory (RegLocalMemory) is
// not m's to release.
func (m *MR) free() {
	if m.fd >= 0 {
		unmap(m.mem, nil)
		unix.Close(m.fd)
	}
}

// maxLocalMR is the most of the device's MRs RegLocalMemory's regions take together.
const maxLocalMR = maxMR / 4 * 3

// What register's error says when RegMR's or RegLocalMemory's limit is reached.
var (
	fullMR      = fmt.Sprintf("device limit of %d MRs", maxMR)
	fullLocalMR = fmt.Sprintf("%d of the device's %d MRs taken, the most caller memory may use", maxLocalMR, maxMR)
)

const page = 4096

// newSharedMemory creates a sealed memfd of at least length bytes (one page at least)
// and maps it shared, counted against quota (nil: the process's share; mapquota.go).
func newSharedMemory(length int, quota *mapQuota) (int, []byte, error) {
	size := max((length+page-1)/page*page, page)
	fd, err := unix.MemfdCreate("rsock-shm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EFBIG) {
			// A memfd is a file: the process's file size limit bounds it too.
			return -1, nil, fmt.Errorf("ftruncate memfd to %d bytes: %w: over the process's RLIMIT_FSIZE (ulimit -f)", size, err)
		}
		return -1, nil, fmt.Errorf("ftruncate memfd: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("seal memfd: %w", err)
	}
	mem, err := mapShared(fd, size, unix.PROT_READ|unix.PROT_WRITE, quota)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("mmap memfd: %w", err)
	}
	return fd, mem, nil
}

// mapPeerRegion maps the memfd a peer passed for a region of size bytes, after checking
// that it cannot fault: it must be sealed against shrinking and hold size bytes. It maps
// it writable when the descriptor allows, counted against quota (mapquota.go). The
// descriptor is closed either way.
func mapPeerRegion(fd int, size uint64, quota *mapQuota) (mem []byte, writable bool, err error) {
	defer unix.Close(fd)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, false, fmt.Errorf("shm: peer region is not a memfd: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, false, fmt.Errorf("shm: peer region can shrink: %w", errMalformed)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, false, fmt.Errorf("shm: stat peer region: %w", err)
	}
	if st.Size < 0 || uint64(st.Size) < size || size > maxRegionSize {
		return nil, false, fmt.Errorf("shm: peer region of %d bytes claims %d: %w", st.Size, size, errMalformed)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, false, fmt.Errorf("shm: peer region flags: %w", err)
	}
	prot := unix.PROT_READ
	writable = fl&unix.O_ACCMODE == unix.O_RDWR
	if writable {
		prot |= unix.PROT_WRITE
	}
	n := max(int(size), 1) // mmap maps no empty range
	mem, err = mapShared(fd, n, prot, quota)
	if err != nil {
		return nil, false, fmt.Errorf("shm: map peer region: %w", err)
	}
	// The capacity is the mapping's, which unmap ends: an empty region's mapping of one
	// byte had a capacity of 0 and stayed mapped. Bounds are checked against the length
	// (rc.Slice).
	return mem[:size:n], writable, nil
}

// shareFD returns a new descriptor of the region for a peer: a duplicate when it grants
// remote write, a read-only reopening when it grants remote read only, so that the peer
// cannot map it writable. The caller closes it. The caller holds m.dev.mrMu for reading.
func (m *MR) shareFD() (int, error) {
	if m.fd < 0 {
		// RegLocalMemory's: no remote access, so regionFor never shares one.
		return -1, fmt.Errorf("shm: share region: caller memory registered for local access only: %w", verbs.ErrInvalidArgument)
	}
	if m.reg.Access&verbs.AccessRemoteWrite != 0 {
		fd, err := unix.FcntlInt(uintptr(m.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("shm: duplicate region descriptor: %w", err)
		}
		return fd, nil
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", m.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("shm: reopen region read-only: %w", err)
	}
	return fd, nil
}

// Bytes returns the region's memory.
func (m *MR) Bytes() []byte { return m.reg.Buf }

// Addr returns the address of Bytes()[0].
func (m *MR) Addr() uint64 { return m.reg.Addr }

// LKey returns the local key; shm regions use one key as both local and remote key.
func (m *MR) LKey() uint32 { return m.key }

// RKey returns the remote key.
func (m *MR) RKey() uint32 { return m.key }

// Access returns the access rights the region was registered with.
func (m *MR) Access() verbs.AccessFlags { return m.reg.Access }

// Close deregisters the region and unmaps it here. A peer that mapped it keeps its own
// mapping of the pages, which no longer belong to anything here, and its requests naming
// the key fail the responder's check.
func (m *MR) Close() error {
	if !m.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("shm: deregister MR: %w", verbs.ErrClosed)
	}
	m.dev.mrs.Remove(m.key)
	// A request already past its checks may be copying: keep the mapping until no
	// responder holds the device's region table, as a DMA under way finishes.
	m.dev.mrMu.Lock()
	m.free()
	m.dev.mrMu.Unlock()
	m.dev.nMR.Add(-1)
	m.pd.refs.Release()
	return nil
}

// lookupMRLocked returns the live region whose key is key, or nil. The caller holds
// d.mrMu for reading for as long as it uses the region's memory.
func (d *device) lookupMRLocked(key uint32) *MR {
	if r := d.mrs.Lookup(key); r != nil {
		m, _ := r.Owner.(*MR) // every region of d is an *MR's (RegMR, RegLocalMemory)
		return m
	}
	return nil
}

// slice returns the bytes [addr, addr+n) of m, or false if they are not all inside m.
func (m *MR) slice(addr uint64, n uint32) ([]byte, bool) { return m.reg.Slice(addr, n) }
