package workload

import (
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// regCounter counts the bytes of memory registered through a provider and not yet
// deregistered.
type regCounter struct {
	bytes atomic.Int64
}

// countRegistered wraps p so that every memory region registered through it is counted
// in r. Only the setup path goes through the wrappers (Open, AllocPD, RegMR, MR.Close):
// QPs, CQs and the MRs' keys and memory are the provider's own, so the data path runs
// exactly as it does on p.
func countRegistered(p verbs.Provider, r *regCounter) verbs.Provider {
	return &countingProvider{Provider: p, r: r}
}

type countingProvider struct {
	verbs.Provider
	r *regCounter
}

// IsolatesRegionsByQP passes the provider's answer through, so that the wrapper keeps
// what the engine does on the provider: it pools endpoint shells (PD, first ring and
// staging buffer, still registered and counted here) only where the provider says so.
func (p *countingProvider) IsolatesRegionsByQP() bool {
	i, ok := p.Provider.(interface{ IsolatesRegionsByQP() bool })
	return ok && i.IsolatesRegionsByQP()
}

func (p *countingProvider) Open(device string) (verbs.Context, error) {
	c, err := p.Provider.Open(device)
	if err != nil {
		return nil, err
	}
	return &countingContext{Context: c, r: p.r}, nil
}

type countingContext struct {
	verbs.Context
	r *regCounter
}

func (c *countingContext) AllocPD() (verbs.PD, error) {
	pd, err := c.Context.AllocPD()
	if err != nil {
		return nil, err
	}
	cp := &countingPD{PD: pd, r: c.r}
	switch reg := pd.(type) { // keep the capability visible
	case verbs.MemoryRegistrar:
		return &countingRegPD{countingPD: cp, reg: reg}, nil
	case verbs.LocalMemoryRegistrar:
		return &countingLocalRegPD{countingPD: cp, reg: reg}, nil
	}
	return cp, nil
}

// countingLocalRegPD is countingRegPD for a provider that registers caller memory for
// local access only (verbs/shm).
type countingLocalRegPD struct {
	*countingPD
	reg verbs.LocalMemoryRegistrar
}

func (p *countingLocalRegPD) RegLocalMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	return p.reg.RegLocalMemory(buf, access)
}

// countingRegPD is a countingPD whose provider registers caller memory: it passes
// RegMemory through uncounted (the memory is the application's, not the engine's), so
// the engine's direct writes run as they do on the provider.
type countingRegPD struct {
	*countingPD
	reg verbs.MemoryRegistrar
}

func (p *countingRegPD) RegMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	return p.reg.RegMemory(buf, access)
}

type countingPD struct {
	verbs.PD
	r *regCounter
}

func (p *countingPD) RegMR(length int, access verbs.AccessFlags) (verbs.MR, error) {
	mr, err := p.PD.RegMR(length, access)
	if err != nil {
		return nil, err
	}
	p.r.bytes.Add(int64(length))
	return &countingMR{MR: mr, r: p.r, length: int64(length)}, nil
}

type countingMR struct {
	verbs.MR
	r      *regCounter
	length int64
	once   sync.Once
}

func (m *countingMR) Close() error {
	err := m.MR.Close()
	if err == nil {
		m.once.Do(func() { m.r.bytes.Add(-m.length) })
	}
	return err
}
