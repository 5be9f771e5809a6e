package soft

import "github.com/rsockio/rsock/verbs"

var _ verbs.MemoryRegistrar = (*PD)(nil)

// RegMemory registers buf, memory the caller owns, as a region of this PD: it
// implements [verbs.MemoryRegistrar]. The region's Bytes is buf, so what remote writes
// place there the caller sees, and what it holds local sends read. It counts against
// the device's MR limit like RegMR's regions and takes the same checks (access rules,
// size, injected AllocMR failures); Close deregisters it and leaves buf alone.
func (p *PD) RegMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	if buf == nil {
		buf = []byte{}
	}
	return p.register(len(buf), buf, access, "register memory")
}
