package soft

import (
	"fmt"
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
	return p.register(length, nil, access, "register MR")
}

// register registers buf, or when buf is nil length bytes it allocates once the checks
// pass, for RegMR and RegMemory; what names the operation in errors.
func (p *PD) register(length int, buf []byte, access verbs.AccessFlags, what string) (verbs.MR, error) {
	d := p.ctx.dev
	if err := provider.CheckRegMR(length, d.attr.MaxMRSize, access); err != nil {
		return nil, err
	}
	if err := d.fab.injectedFailure(AllocMR); err != nil {
		return nil, fmt.Errorf("soft: %s: %w", what, err)
	}
	if !reserve(&d.nMR, d.attr.MaxMR) {
		return nil, fmt.Errorf("soft: %s: device limit of %d MRs: %w", what, d.attr.MaxMR, verbs.ErrNoResources)
	}
	if err := p.refs.Acquire(); err != nil {
		d.nMR.Add(-1)
		return nil, fmt.Errorf("soft: %s: %w", what, err)
	}
	if buf == nil {
		buf = make([]byte, length)
	}
	const page = 4096
	span := (uint64(length)+page-1)/page*page + page // one unmapped guard page after each region
	m := &MR{
		pd:  p,
		dev: d,
		reg: rc.Region{
			PD:     &p.refs,
			Buf:    buf[:length:length],
			Addr:   d.fab.nextAddr.Add(span) - span,
			Access: access,
		},
	}
	key, err := d.mrs.Insert(&m.reg)
	if err != nil {
		p.refs.Release()
		d.nMR.Add(-1)
		return nil, fmt.Errorf("soft: %s: %w", what, err)
	}
	m.key = key
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
	m.dev.mrs.Remove(m.key)
	m.dev.nMR.Add(-1)
	m.pd.refs.Release()
	m.dev.fab.live.mrs.Add(-1)
	return nil
}

// slice returns the bytes [addr, addr+n) of m, or false if they are not all inside m.
func (m *MR) slice(addr uint64, n uint32) ([]byte, bool) { return m.reg.Slice(addr, n) }
