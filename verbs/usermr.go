package verbs

// MemoryRegistrar is implemented by protection domains that can register memory the
// caller already owns (ibv_reg_mr on an existing buffer), as opposed to [PD.RegMR],
// which allocates the region's memory itself. It is a capability: a provider offers it
// only where registering arbitrary caller memory is safe for it. Soft does (its regions
// are Go memory in one process), and so does ibv, which pins the buffer (for the
// garbage collector and, through the kernel, for the device) until the region is
// closed; a provider whose peers can reach only memory it shares with them (shm) does
// not, and offers [LocalMemoryRegistrar] instead; callers that need a peer to reach the
// memory fall back to copying into a region of their own. Memory a provider pins counts
// against RLIMIT_MEMLOCK: callers that bound what they pin check the provider's
// PinsMemory, as for RegMR.
//
// The returned [MR]'s Bytes is buf itself. The caller must keep buf alive and must
// not expect the provider to read or write it after [MR.Close] returns; MR.Close
// deregisters the region and frees nothing. Work requests may name the region only
// while it is registered, as with any MR.
type MemoryRegistrar interface {
	RegMemory(buf []byte, access AccessFlags) (MR, error)
}

// LocalMemoryRegistrar is implemented by protection domains that can register memory
// the caller already owns for local access only: the region may be named in the SGEs
// of the caller's own work requests (the source of a send or RDMA WRITE, the sink of a
// receive or RDMA READ), never by a peer's rkey. shm offers it where it cannot offer
// [MemoryRegistrar]: a peer process can map only memory shared with it, but this
// process's requests copy from and into any memory of its own. Remote access flags are
// refused ([ErrInvalidArgument]). Otherwise the rules are MemoryRegistrar's: the
// returned [MR]'s Bytes is buf itself, the caller keeps buf alive, and MR.Close
// deregisters the region and frees nothing.
//
// Its method has a name of its own so that a provider offering only this capability
// does not also satisfy MemoryRegistrar.
type LocalMemoryRegistrar interface {
	RegLocalMemory(buf []byte, access AccessFlags) (MR, error)
}
