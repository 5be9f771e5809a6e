package rdma

import (
	"fmt"

	"github.com/rsockio/rsock/verbs"
)

// Direct writes on a provider that pins (rdma-core): registering the application's
// buffer pins its pages until the registration ends, so those registrations are the
// engine's to count and to bound, like its rings and staging buffers.
//
//   - Counted: registerUserMR charges each one to Options.MaxRegisteredMemory,
//     RLIMIT_MEMLOCK and Options.Budget, and its Close gives the charge back. A charge
//     refused, or the kernel's ENOMEM, turns direct writes off for the Conn (zcopy.go's
//     directRegion): its Writes, that one included, are staged; none fails for it.
//   - Bounded: a buffer over directPinMax is staged (that Write only), so the cache
//     pins at most directCacheSize × directPinMax bytes per Conn, and only while its
//     entries are in use: idleDirectLocked lets go of those no Write used for a
//     keepalive period, teardown of all.
//   - Alive: the cache references every buffer it holds registered, and the provider
//     pins it for the garbage collector (verbs/ibv: runtime.Pinner), so a cache hit is
//     always the same live memory, never pages the runtime freed and reused.
//   - Reusable at once: a direct Write returns after the device completed its WRs (on
//     RC: the peer acknowledged the bytes), so the application may overwrite the buffer
//     as soon as Write returns; if the QP fails, the Write returns its error once the
//     QP is in ERROR, when the device reads no more of it.
const directPinMax = 4 << 20

// registerDirect registers p, the application's buffer, for a direct Write through
// reg, the endpoint's PD. On a provider that pins, it is counted and bounded as above;
// a refusal because p is too large wraps verbs.ErrInvalidArgument (this Write is
// staged), any other error means no resources (direct writes are turned off).
func (c *Conn) registerDirect(reg verbs.MemoryRegistrar, p []byte) (verbs.MR, error) {
	if c.ep == nil || c.ep.dev == nil || !c.ep.pinsMemory() { // nil: a test's fake Conn
		return reg.RegMemory(p, verbs.AccessLocalWrite)
	}
	if len(p) > directPinMax {
		return nil, fmt.Errorf("rdma: write: a %d-byte buffer is over the %d bytes a direct write pins: %w",
			len(p), directPinMax, verbs.ErrInvalidArgument)
	}
	return c.ep.registerUserMR(reg, p, verbs.AccessLocalWrite)
}
