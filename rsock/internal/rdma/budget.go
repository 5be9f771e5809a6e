package rdma

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
)

// This file is the accounting of registered memory. Every memory region the engine
// registers goes through registerMR, which checks two limits before it asks the device:
//
//   - Options.MaxRegisteredMemory, a budget per device of this process that the
//     application chooses;
//   - RLIMIT_MEMLOCK, when the provider pins what it registers (rdma-core does; soft
//     does not) and the process lacks CAP_IPC_LOCK: the kernel refuses a registration
//     that would take the process's pinned pages past the limit, with an ENOMEM that
//     names neither the limit nor the fix.
//
// Over either, registerMR fails with a reason that names the limit and the figures, and
// the connection falls back. An ENOMEM from the device itself (other memory pinned by
// the process, or a limit lowered since) is reported the same way, with the fix.

// pinner is implemented by providers whose memory registrations pin pages against
// RLIMIT_MEMLOCK (verbs/ibv).
type pinner interface{ PinsMemory() bool }

// memlockLimit reports RLIMIT_MEMLOCK's soft limit in bytes and whether it binds this
// process: not when it is unlimited, nor when the process has CAP_IPC_LOCK. It is a
// variable so that tests can set a limit without changing the process's.
var memlockLimit = func() (limit uint64, binds bool) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return 0, false
	}
	return rl.Cur, !hasCapIPCLock()
}

// capIPCLock is CAP_IPC_LOCK's bit in the capability sets of /proc/self/status.
const capIPCLock = 14

// hasCapIPCLock reports whether the process's effective capabilities include
// CAP_IPC_LOCK, which exempts it from RLIMIT_MEMLOCK. Unknown counts as no.
func hasCapIPCLock() bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	return capEffHas(f, capIPCLock)
}

// capEffHas reports whether the CapEff line of a /proc/<pid>/status text has bit set.
func capEffHas(status io.Reader, bit uint) bool {
	s := bufio.NewScanner(status)
	for s.Scan() {
		v, ok := strings.CutPrefix(s.Text(), "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		return err == nil && caps&(1<<bit) != 0
	}
	return false
}

// registered counts the memory the process has registered: per device, against
// Options.MaxRegisteredMemory, and over every device whose provider pins, against
// RLIMIT_MEMLOCK.
var registered = struct {
	sync.Mutex
	pinned   int64
	byDevice map[*device]int64
}{byDevice: make(map[*device]int64)}

// regCharge is one registration's share of the counts, returned by uncharge.
type regCharge struct {
	dev    *device
	bytes  int64 // counted against the device's budget
	pinned int64 // counted against RLIMIT_MEMLOCK: bytes rounded up to whole pages, or 0
}

// charge counts n more registered bytes on d, or fails with ErrMemoryBudget or
// ErrMemlock, naming the figures, when they do not fit. budget is
// Options.MaxRegisteredMemory (0: none).
func charge(d *device, pins bool, n int, budget int64) (regCharge, error) {
	c := regCharge{dev: d, bytes: int64(n)}
	if pins {
		page := int64(os.Getpagesize())
		c.pinned = (c.bytes + page - 1) / page * page
	}
	registered.Lock()
	defer registered.Unlock()
	used := registered.byDevice[d]
	if budget > 0 && used+c.bytes > budget {
		return regCharge{}, fmt.Errorf("%w: %d bytes more on %s would make %d, over the budget of %d (MaxRegisteredMemory)",
			ErrMemoryBudget, c.bytes, d.key.name, used+c.bytes, budget)
	}
	if c.pinned > 0 {
		if limit, binds := memlockLimit(); binds && uint64(registered.pinned+c.pinned) > limit {
			return regCharge{}, fmt.Errorf("%w: %d bytes more would pin %d, over RLIMIT_MEMLOCK of %d; %s",
				ErrMemlock, c.pinned, registered.pinned+c.pinned, limit, memlockFix)
		}
	}
	registered.byDevice[d] = used + c.bytes
	registered.pinned += c.pinned
	return c, nil
}

// memlockFix is what a reason naming RLIMIT_MEMLOCK tells the operator to do.
const memlockFix = "raise it (ulimit -l, LimitMEMLOCK= in systemd, --ulimit memlock in docker) or set a smaller MaxRegisteredMemory"

// uncharge gives back what charge counted.
func (c regCharge) uncharge() {
	if c.dev == nil {
		return
	}
	registered.Lock()
	defer registered.Unlock()
	if left := registered.byDevice[c.dev] - c.bytes; left > 0 {
		registered.byDevice[c.dev] = left
	} else {
		delete(registered.byDevice, c.dev)
	}
	registered.pinned -= c.pinned
}

// RegisteredMemory returns how many bytes of memory the engine has registered, over
// all devices of the process, and how many of them are pinned against RLIMIT_MEMLOCK.
func RegisteredMemory() (total, pinned int64) {
	registered.Lock()
	defer registered.Unlock()
	for _, n := range registered.byDevice {
		total += n
	}
	return total, registered.pinned
}

// countedMR is a registered region together with its share of the counts, which Close
// gives back.
type countedMR struct {
	verbs.MR
	charge regCharge
	ep     *Endpoint // whose Options.Budget was charged budgeted bytes for it
	budget int
}

// Close deregisters the region and uncharges it.
func (m *countedMR) Close() error {
	err := m.MR.Close()
	m.charge.uncharge()
	m.charge = regCharge{}
	if m.ep != nil {
		m.ep.refund(0, m.budget)
		m.ep = nil
	}
	return err
}

// registerMR registers n bytes with access on the endpoint's device, counted against
// Options.MaxRegisteredMemory and RLIMIT_MEMLOCK; what names the region in errors. It
// is the only place the engine registers memory.
func (ep *Endpoint) registerMR(n int, access verbs.AccessFlags, what string) (verbs.MR, error) {
	return ep.registerMRIn(nil, n, access, what)
}

// registerMRIn is registerMR keeping the region's record in m, if not nil: the
// endpoint's first ring and send buffer live in the endpoint, so that preparing it
// allocates less.
func (ep *Endpoint) registerMRIn(m *countedMR, n int, access verbs.AccessFlags, what string) (verbs.MR, error) {
	return ep.registerCounted(m, n, what, func() (verbs.MR, error) { return ep.pd.RegMR(n, access) })
}

// pinsMemory reports whether the endpoint's provider pins what it registers.
func (ep *Endpoint) pinsMemory() bool {
	p, _ := ep.dev.key.provider.(pinner)
	return p != nil && p.PinsMemory()
}

// registerUserMR registers buf, memory the application owns, through reg (the
// endpoint's PD), counted like the engine's own regions: against
// Options.MaxRegisteredMemory, RLIMIT_MEMLOCK and Options.Budget. Direct writes
// (zcopy.go) use it on a provider that pins; what they register on one that does not is
// the application's memory, neither pinned nor the engine's, and left uncounted.
func (ep *Endpoint) registerUserMR(reg verbs.MemoryRegistrar, buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	return ep.registerCounted(nil, len(buf), "written buffer", func() (verbs.MR, error) { return reg.RegMemory(buf, access) })
}

// registerCounted makes register's region of n bytes, in the endpoint's own PD, charged
// to Options.MaxRegisteredMemory, RLIMIT_MEMLOCK and Options.Budget, and returns it as
// a countedMR (m, if not nil), whose Close gives the charges back. Every region the
// engine registers is made here.
func (ep *Endpoint) registerCounted(m *countedMR, n int, what string, register func() (verbs.MR, error)) (verbs.MR, error) {
	pins := ep.pinsMemory()
	c, err := charge(ep.dev, pins, n, ep.opts.MaxRegisteredMemory)
	for err != nil { // pooled shells (pool.go) must not refuse a registration
		if evict, anywhere := evictsFor(err); !evict || !evictShell(ep.dev, anywhere) {
			break
		}
		c, err = charge(ep.dev, pins, n, ep.opts.MaxRegisteredMemory)
	}
	if err != nil {
		return nil, fmt.Errorf("register %d-byte %s: %w", n, what, err)
	}
	if err := ep.charge(0, n); err != nil { // Options.Budget
		c.uncharge()
		return nil, fmt.Errorf("register %d-byte %s: %w", n, what, err)
	}
	mr, err := register()
	for err != nil && pins && errors.Is(err, syscall.ENOMEM) && evictShell(ep.dev, true) {
		mr, err = register() // pooled shells pinned what the kernel refused
	}
	if err != nil {
		ep.refund(0, n)
		c.uncharge()
		if errors.Is(err, syscall.ENOMEM) && pins {
			limit, binds := memlockLimit()
			lim := "unlimited"
			if binds {
				lim = strconv.FormatUint(limit, 10)
			}
			return nil, fmt.Errorf("register %d-byte %s: %w: %w (RLIMIT_MEMLOCK %s, %d bytes pinned by rsock); %s",
				n, what, ErrMemlock, err, lim, pinnedNow(), memlockFix)
		}
		return nil, fmt.Errorf("register %d-byte %s: %w", n, what, err)
	}
	if m == nil {
		m = new(countedMR)
	}
	*m = countedMR{MR: mr, charge: c, ep: ep, budget: n}
	return m, nil
}

// growthFits reports whether n more bytes may be pinned to grow a ring past 512 KiB. On
// a provider that pins, while RLIMIT_MEMLOCK binds, such growth may take what the
// process has pinned to half the limit and no further: the rings of a few streams could
// otherwise pin all of it, and every connection prepared after them would fall back for
// want of the few kilobytes it needs (rings up to 512 KiB grow as before, refused only
// by the limit itself).
func (ep *Endpoint) growthFits(n int) bool {
	if !ep.pinsMemory() {
		return true
	}
	limit, binds := memlockLimit()
	if !binds {
		return true
	}
	_, pinned := RegisteredMemory()
	return uint64(pinned)+uint64(n) <= limit/2
}

// pinnedNow is the bytes rsock has pinned, for error texts.
func pinnedNow() int64 {
	_, p := RegisteredMemory()
	return p
}
