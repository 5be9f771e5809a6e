// Package vma bounds the memory mappings that rsock's providers make, so that they never
// take the last of the kernel's per-process limit on them.
//
// Linux refuses a process more mappings than vm.max_map_count (65,530 by default). A
// provider's mmap refused for it fails one connection, which falls back; but the Go
// runtime maps memory too, as the heap grows, and when its mmap is refused the whole
// process dies ("fatal error: runtime: cannot allocate memory"). Shared memory takes
// about five mappings per connection end (verbs/shm: its ring and staging, the
// channel to its peer and the peer's channel, the peer's ring), so some 13,000
// same-host connection ends would have taken them all: seen on this project's
// development machine with the limit lowered to 2,500, at about 270 connections.
//
// So every mapping a provider makes is counted here first (Reserve), and the count may
// not pass half of vm.max_map_count: the other half stays for the runtime, the C
// libraries and the application. A Reserve past that fails with an error that matches
// verbs.ErrNoResources and names the limit, and the connection that asked falls back
// with it as its reason. The count is rsock's own: a process whose other mappings
// already come near the limit can still have a provider's mmap refused, which fails
// that connection alike.
package vma

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// defaultMaxMapCount is Linux's vm.max_map_count unless changed (DEFAULT_MAX_MAP_COUNT),
// assumed when /proc/sys/vm/max_map_count cannot be read.
const defaultMaxMapCount = 65530

const maxMapCountFile = "/proc/sys/vm/max_map_count"

var (
	held      atomic.Int64 // mappings counted and not yet given back
	limit     atomic.Int64 // the most held may reach; 0 until first read (budget)
	loadMu    sync.Mutex   // guards reading the limit, fixed and limitFile
	fixed     bool         // the limit is SetBudget's, not read
	limitFile = maxMapCountFile
)

// Reserve counts n mappings about to be made. It fails, counting nothing, when that
// would take the count past half of vm.max_map_count. Each mapping counted is given
// back with Release once unmapped, or once its mmap failed.
//
// Before it refuses, it reads vm.max_map_count again: an operator told by a fallback
// reason to raise it need not restart the process. Refusals are rare, and the read
// takes microseconds, next to the connection setup it refuses.
func Reserve(n int) error {
	most := Budget()
	reread := false
	for {
		h := held.Load()
		if h+int64(n) > most {
			if !reread {
				most, reread = readBudget(), true
				continue
			}
			return &LimitError{Held: h, Want: n, Budget: most}
		}
		if held.CompareAndSwap(h, h+int64(n)) {
			return nil
		}
	}
}

// Release gives back n mappings counted by Reserve.
func Release(n int) { held.Add(-int64(n)) }

// Held returns the mappings counted now.
func Held() int64 { return held.Load() }

// Budget returns the most mappings that may be counted at once: half of
// vm.max_map_count, as last read, or SetBudget's.
func Budget() int64 {
	if b := limit.Load(); b > 0 {
		return b
	}
	return readBudget() // SetBudget(0)'s 0 too
}

// readBudget reads vm.max_map_count and makes half of it the budget, unless SetBudget
// fixed one.
func readBudget() int64 {
	loadMu.Lock()
	defer loadMu.Unlock()
	if fixed {
		return limit.Load()
	}
	b := max(readMaxMapCount(limitFile)/2, 1)
	limit.Store(b)
	return b
}

// readMaxMapCount returns the limit file names, or Linux's default when it cannot be
// read or parsed.
func readMaxMapCount(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return defaultMaxMapCount
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 {
		return defaultMaxMapCount
	}
	return n
}

// SetBudget makes b the most mappings counted at once, until restore is called: for
// tests, which cannot lower vm.max_map_count for their process alone.
func SetBudget(b int64) (restore func()) {
	return setLimit(b, true)
}

// setLimit sets the budget to b, fixed or to be read again, until restore is called.
func setLimit(b int64, fix bool) (restore func()) {
	loadMu.Lock()
	oldLimit, oldFixed := limit.Load(), fixed
	limit.Store(b)
	fixed = fix
	loadMu.Unlock()
	return func() {
		loadMu.Lock()
		limit.Store(oldLimit)
		fixed = oldFixed
		loadMu.Unlock()
	}
}

// LimitError is Reserve's error: counting Want more mappings would pass Budget.
type LimitError struct {
	Held   int64 // mappings counted when it was refused
	Want   int   // mappings asked for
	Budget int64 // the most counted at once: half of vm.max_map_count
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("rsock holds %d memory mappings, and %d more would pass its share of the process's limit (%d, half of vm.max_map_count)",
		e.Held, e.Want, e.Budget)
}

// Is makes a LimitError match verbs.ErrNoResources: a connection refused it may fall
// back, and one that closes gives the mappings back.
func (e *LimitError) Is(target error) bool { return target == verbs.ErrNoResources }
