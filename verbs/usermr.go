package verbs

// MemoryRegistrar is implemented by protection domains that can register memory the
// caller already owns (ibv_reg_mr on an existing buffer), as opposed to [PD.RegMR],
// which allocates the region's memory itself. It is a capability: a provider offers it
// only where registering arbitrary caller memory is safe for it. Soft does (its
// regions are Go memory in one process); a provider that pins pages for a device, or
// that can reach only memory it shares with another process, does not, and callers
// fall back to copying into a region of their own.
//
// The returned [MR]'s Bytes is buf itself. The caller must keep buf alive and must
// not expect the provider to read or write it after [MR.Close] returns; MR.Close
// deregisters the region and frees nothing. Work requests may name the region only
// while it is registered, as with any MR.
type MemoryRegistrar interface {
	RegMemory(buf []byte, access AccessFlags) (MR, error)
}
