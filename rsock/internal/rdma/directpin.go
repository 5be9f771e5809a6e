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

// directPinMinWrite is the smallest direct Write on a provider that pins. A direct
// Write returns only once the device has completed its sends, on RC once the peer
// acknowledged them, so the next Write cannot overlap this one's transfer: each costs
// a round trip without data, where a staged Write returns once its bytes are copied
// and posted. Under 1 MiB that round trip costs more than the copy it saves: on
// Soft-RoCE in the CI's VM, streams of 64 KiB direct Writes ran at 0.56× to 0.76× the
// staged ones beside them (two boots), where 1 MiB direct Writes ran at 1.0× to 1.2×
// (one boot): the round trip is shared by 16 times the bytes. (shm's round trip is
// short enough for directMinWrite: see zcopy.go.)
const directPinMinWrite = 1 << 20

// directMinLocked raises the smallest direct Write to directPinMinWrite on a provider
// that pins, unless the Conn set one (minLen; tests do). Called with mu held, when
// directRegion first looks the capability up: that Write, and every later one, is
// held to it. (Writers hold wmu, which orders this with writeDirect's read of minLen.)
func (c *Conn) directMinLocked() {
	if c.direct.reg != nil && c.direct.minLen == 0 && c.ep.dev != nil && c.ep.pinsMemory() {
		c.direct.minLen = directPinMinWrite
	}
}

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
