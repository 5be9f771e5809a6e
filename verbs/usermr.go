package verbs

// MemoryRegistrar is implemented by protection domains that can register memory the
// caller already owns (ibv_reg_mr on an existing buffer), as opposed to [PD.RegMR],
// which allocates the region's memory itself. It is a capability: a provider offers it
// only where registering arbitrary caller memory is safe for it. Soft does (its
// regions are Go memory in one process), and so does ibv, which pins the buffer (for
// the garbage collector and, through the kernel, for the device) until the region is
// closed; a provider that can reach only memory it shares with another process (shm)
// does not, and callers fall back to copying into a region of their own. Memory a
// provider pins counts against RLIMIT_MEMLOCK: callers that bound what they pin check
// the provider's PinsMemory, as for RegMR.
//
// The returned [MR]'s Bytes is buf itself. The caller must keep buf alive and must
// not expect the provider to read or write it after [MR.Close] returns; MR.Close
// deregisters the region and frees nothing. Work requests may name the region only
// while it is registered, as with any MR.
type MemoryRegistrar interface {
	RegMemory(buf []byte, access AccessFlags) (MR, error)
}
