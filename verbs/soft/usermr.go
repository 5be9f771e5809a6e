package soft

import (
	"fmt"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

var _ verbs.MemoryRegistrar = (*PD)(nil)

// RegMemory registers buf, memory the caller owns, as a region of this PD: it
// implements [verbs.MemoryRegistrar]. The region's Bytes is buf, so what remote writes
// place there the caller sees, and what it holds local sends read. It counts against
// the device's MR limit like RegMR's regions and takes the same checks (access rules,
// size, injected AllocMR failures); Close deregisters it and leaves buf alone.
func (p *PD) RegMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	d := p.ctx.dev
	if err := provider.CheckRegMR(len(buf), d.attr.MaxMRSize, access); err != nil {
		return nil, err
	}
	if err := d.fab.injectedFailure(AllocMR); err != nil {
		return nil, fmt.Errorf("soft: register memory: %w", err)
	}
	if !reserve(&d.nMR, d.attr.MaxMR) {
		return nil, fmt.Errorf("soft: register memory: device limit of %d MRs: %w", d.attr.MaxMR, verbs.ErrNoResources)
	}
	if err := p.refs.Acquire(); err != nil {
		d.nMR.Add(-1)
		return nil, fmt.Errorf("soft: register memory: %w", err)
	}
	const page = 4096
	span := (uint64(len(buf))+page-1)/page*page + page // a guard page after it, as RegMR's
	m := &MR{
		pd:  p,
		dev: d,
		reg: rc.Region{
			PD:     &p.refs,
			Buf:    buf[:len(buf):len(buf)],
			Addr:   d.fab.nextAddr.Add(span) - span,
			Access: access,
		},
	}
	key, err := d.mrs.Insert(&m.reg)
	if err != nil {
		p.refs.Release()
		d.nMR.Add(-1)
		return nil, fmt.Errorf("soft: register caller memory: %w", err)
	}
	m.key = key
	d.fab.live.mrs.Add(1)
	return m, nil
}
