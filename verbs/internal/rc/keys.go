package rc

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// The key table maps a key to its region without locks or allocation. A key is a table
// index (high 24 bits) and a generation (low 8 bits) that changes each time the index is
// reused, so a stale key fails the lookup. Index 0 is never used, so key 0 names nothing.
const (
	keyChunkBits = 10
	keyChunkSize = 1 << keyChunkBits
	keyChunks    = 1 << 10
	keyGenBits   = 8

	// MaxKeyIndexes is how many regions a KeyTable holds at once.
	MaxKeyIndexes = keyChunks*keyChunkSize - 1
)

type keyChunk [keyChunkSize]atomic.Pointer[Region]

// KeyTable is a provider's table of live regions by key, one per device. It is a
// concrete type, not an interface, so that a lookup on the work-request path inlines.
//
// Lookups take no lock; Insert and Remove serialise on the table's own mutex. The zero
// KeyTable is empty and reuses the index of a removed region under the next generation,
// so that a key comes back only after 256 registrations on one index (soft's rule).
// [KeyTable.NeverReuse] makes it retire an index instead of wrapping its generation, so
// that no key ever names two regions (shm's rule, as a peer may still hold a key),
// except for the indexes of [KeyTable.InsertLocal]'s regions, whose keys no peer holds.
type KeyTable struct {
	chunks [keyChunks]atomic.Pointer[keyChunk]

	mu         sync.Mutex // guards the fields below; lookups don't take it
	free       []uint32   // released indexes
	freeLocal  []uint32   // released indexes of InsertLocal's pool
	local      []bool     // whether each used index is InsertLocal's
	next       uint32     // next never-used index
	gen        []uint8    // generation of each used index
	neverReuse bool
}

// NeverReuse makes t never hand out a key twice: an index whose generation is spent is
// retired rather than wrapped. Call it before the first Insert.
func (t *KeyTable) NeverReuse() { t.neverReuse = true }

// Insert gives r a fresh key, publishes r under it to lookups and returns the key. It
// fails with [verbs.ErrNoResources] when every index is live or retired.
func (t *KeyTable) Insert(r *Region) (uint32, error) { return t.insert(r, false) }

// InsertLocal is Insert for a region whose key no peer will ever hold: one that grants
// no remote access, named only by the provider's own work requests (shm's
// RegLocalMemory). Under NeverReuse its index is reused under the next generation, as
// in the zero table, so that registering such regions over and over retires nothing;
// those indexes form a pool of their own, never given to Insert, so that a key a peer
// may hold still names no other region.
func (t *KeyTable) InsertLocal(r *Region) (uint32, error) { return t.insert(r, true) }

func (t *KeyTable) insert(r *Region, local bool) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	free := &t.free
	if local {
		free = &t.freeLocal
	}
	var idx uint32
	if n := len(*free); n > 0 {
		idx = (*free)[n-1]
		*free = (*free)[:n-1]
		t.gen[idx]++
	} else {
		if t.next == 0 {
			t.next = 1
			t.gen = append(t.gen, 0)
			t.local = append(t.local, false)
		}
		if t.next > MaxKeyIndexes {
			return 0, fmt.Errorf("region key table full (%d indexes): %w", MaxKeyIndexes, verbs.ErrNoResources)
		}
		idx = t.next
		t.next++
		t.gen = append(t.gen, 0)
		t.local = append(t.local, local)
	}
	c := t.chunks[idx>>keyChunkBits].Load()
	if c == nil {
		c = new(keyChunk)
		t.chunks[idx>>keyChunkBits].Store(c)
	}
	r.key = idx<<keyGenBits | uint32(t.gen[idx])
	c[idx&(keyChunkSize-1)].Store(r) // publishes r, key included, to lookups
	return r.key, nil
}

// Remove unpublishes the region whose key is key, if it is live: from then on the key
// names nothing.
func (t *KeyTable) Remove(key uint32) {
	idx := key >> keyGenBits
	if idx == 0 || idx > MaxKeyIndexes {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.chunks[idx>>keyChunkBits].Load()
	if c == nil {
		return
	}
	slot := &c[idx&(keyChunkSize-1)]
	if r := slot.Load(); r == nil || r.key != key {
		return
	}
	slot.Store(nil)
	switch {
	case t.local[idx]:
		t.freeLocal = append(t.freeLocal, idx)
	case t.neverReuse && t.gen[idx] == 1<<keyGenBits-1:
		// the index's keys are spent: retire it
	default:
		t.free = append(t.free, idx)
	}
}

// Lookup returns the live region whose key is key, or nil.
func (t *KeyTable) Lookup(key uint32) *Region {
	idx := key >> keyGenBits
	// The mask keeps the chunk index in range without a bounds check; a key past the
	// table lands on another index, whose region's key then differs.
	c := t.chunks[(idx>>keyChunkBits)&(keyChunks-1)].Load()
	if c == nil {
		return nil
	}
	r := c[idx&(keyChunkSize-1)].Load()
	if r == nil || r.key != key {
		return nil
	}
	return r
}

// ByAddr returns a live region holding [addr, addr+n) and those bytes, or nil. It scans
// the table: only inline sends whose SGE names no region that holds it use it.
func (t *KeyTable) ByAddr(addr uint64, n uint32) (*Region, []byte) {
	t.mu.Lock()
	limit := t.next
	t.mu.Unlock()
	for idx := uint32(1); idx < limit; idx++ {
		c := t.chunks[idx>>keyChunkBits].Load()
		if c == nil {
			continue
		}
		if r := c[idx&(keyChunkSize-1)].Load(); r != nil {
			if b, ok := r.Slice(addr, n); ok {
				return r, b
			}
		}
	}
	return nil, nil
}
