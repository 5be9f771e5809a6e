package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// MR is a registered memory region. It implements [verbs.MR].
//
// Its memory is an ordinary Go byte slice. Addr is synthetic: every region of a fabric gets
// its own page-aligned range of a fabric-wide address space, never reused, so an address or
// key that outlives its region, or that belongs to another device, is caught by the bounds
// and key checks instead of landing in the wrong buffer.
type MR struct {
	pd     *PD
	dev    *device
	reg    rc.Region // memory, address and access rights, as the RC core checks them
	key    uint32
	closed atomic.Bool
}

// RegMR allocates and registers length bytes. As ibv_reg_mr(3) requires, remote write
// access needs local write access too.
func (p *PD) RegMR(length int, access verbs.AccessFlags) (verbs.MR, error) {
	d := p.ctx.dev
	if err := provider.CheckRegMR(length, d.attr.MaxMRSize, access); err != nil {
		return nil, err
	}
	if err := d.fab.injectedFailure(AllocMR); err != nil {
		return nil, fmt.Errorf("soft: register MR: %w", err)
	}
	if !reserve(&d.nMR, d.attr.MaxMR) {
		return nil, fmt.Errorf("soft: register MR: device limit of %d MRs: %w", d.attr.MaxMR, verbs.ErrNoResources)
	}
	if err := p.refs.Acquire(); err != nil {
		d.nMR.Add(-1)
		return nil, fmt.Errorf("soft: register MR: %w", err)
	}
	const page = 4096
	span := (uint64(length)+page-1)/page*page + page // one unmapped guard page after each region
	m := &MR{
		pd:  p,
		dev: d,
		reg: rc.Region{
			PD:     &p.refs,
			Buf:    make([]byte, length),
			Addr:   d.fab.nextAddr.Add(span) - span,
			Access: access,
		},
	}
	d.mrs.insert(m)
	d.fab.live.mrs.Add(1)
	return m, nil
}

// Bytes returns the region's memory.
func (m *MR) Bytes() []byte { return m.reg.Buf }

// Addr returns the address of Bytes()[0] in the fabric's address space.
func (m *MR) Addr() uint64 { return m.reg.Addr }

// LKey returns the local key. Soft regions use one key as both local and remote key.
func (m *MR) LKey() uint32 { return m.key }

// RKey returns the remote key.
func (m *MR) RKey() uint32 { return m.key }

// Access returns the access rights the region was registered with.
func (m *MR) Access() verbs.AccessFlags { return m.reg.Access }

// Close deregisters the region: from then on its keys name nothing. Work requests already
// past their access checks finish their copy, as DMA already under way would.
func (m *MR) Close() error {
	if !m.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("soft: deregister MR: %w", verbs.ErrClosed)
	}
	m.dev.mrs.remove(m.key)
	m.dev.nMR.Add(-1)
	m.pd.refs.Release()
	m.dev.fab.live.mrs.Add(-1)
	return nil
}

// slice returns the bytes [addr, addr+n) of m, or false if they are not all inside m.
func (m *MR) slice(addr uint64, n uint32) ([]byte, bool) { return m.reg.Slice(addr, n) }

// The key table maps a key to its region without locks or allocation: a key is a table
// index (high 24 bits) and a generation (low 8 bits) that changes each time the index is
// reused, so a stale key fails the lookup. Index 0 is never used, so key 0 names nothing.
const (
	mrChunkBits = 10
	mrChunkSize = 1 << mrChunkBits
	mrChunks    = 1 << 10
)

type mrChunk [mrChunkSize]atomic.Pointer[MR]

type mrTable struct {
	chunks [mrChunks]atomic.Pointer[mrChunk]

	mu   sync.Mutex // guards the fields below; lookups don't take it
	free []uint32   // released indexes
	next uint32     // next never-used index
	gen  []uint8    // generation of each used index
}

// insert gives m a fresh key, stores it under that key and returns the key. The caller has reserved room within
// the device's MR limit, which is below the table's capacity.
func (t *mrTable) insert(m *MR) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
		t.gen[idx]++
	} else {
		if t.next == 0 {
			t.next = 1
			t.gen = append(t.gen, 0)
		}
		idx = t.next
		t.next++
		t.gen = append(t.gen, 0)
	}
	c := t.chunks[idx>>mrChunkBits].Load()
	if c == nil {
		c = new(mrChunk)
		t.chunks[idx>>mrChunkBits].Store(c)
	}
	m.key = idx<<8 | uint32(t.gen[idx])
	c[idx&(mrChunkSize-1)].Store(m) // publishes m, key included, to lookups
	return m.key
}

func (t *mrTable) remove(key uint32) {
	idx := key >> 8
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.chunks[idx>>mrChunkBits].Load(); c != nil {
		c[idx&(mrChunkSize-1)].Store(nil)
		t.free = append(t.free, idx)
	}
}

// lookup returns the live region whose key is key, or nil.
func (t *mrTable) lookup(key uint32) *MR {
	idx := key >> 8
	if idx>>mrChunkBits >= mrChunks {
		return nil
	}
	c := t.chunks[idx>>mrChunkBits].Load()
	if c == nil {
		return nil
	}
	m := c[idx&(mrChunkSize-1)].Load()
	if m == nil || m.key != key {
		return nil
	}
	return m
}

// LookupRegion returns the RC core of the live region whose key is key, or nil
// ([rc.Keys]).
func (t *mrTable) LookupRegion(key uint32) *rc.Region {
	if m := t.lookup(key); m != nil {
		return &m.reg
	}
	return nil
}

// byAddr returns a live region holding [addr, addr+n). It scans the table: only inline
// sends whose SGE names no matching key use it.
func (t *mrTable) byAddr(addr uint64, n uint32) (*MR, []byte) {
	t.mu.Lock()
	limit := t.next
	t.mu.Unlock()
	for idx := uint32(1); idx < limit; idx++ {
		c := t.chunks[idx>>mrChunkBits].Load()
		if c == nil {
			continue
		}
		if m := c[idx&(mrChunkSize-1)].Load(); m != nil {
			if b, ok := m.slice(addr, n); ok {
				return m, b
			}
		}
	}
	return nil, nil
}
