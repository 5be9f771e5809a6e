package rc

import (
	"fmt"

	"github.com/rsockio/rsock/verbs"
)

// ValidAccess is every access flag a region or a QP may be given.
const ValidAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

// MaxMessage is the largest RC message: a work request whose SGL holds more is a local
// length error.
const MaxMessage = 1 << 31

// CheckRegMR checks the arguments of ibv_reg_mr for a device whose regions hold at most
// maxSize bytes. As ibv_reg_mr(3) requires, remote write access needs local write
// access too. The error wraps [verbs.ErrInvalidArgument].
func (p *Provider) CheckRegMR(length int, maxSize uint64, access verbs.AccessFlags) error {
	switch {
	case length < 0 || uint64(length) > maxSize:
		return fmt.Errorf("%s: register MR of %d bytes (device max %d): %w", p.name, length, maxSize, verbs.ErrInvalidArgument)
	case access&^ValidAccess != 0:
		return fmt.Errorf("%s: register MR: unknown access flags %#x: %w", p.name, uint32(access&^ValidAccess), verbs.ErrInvalidArgument)
	case access&verbs.AccessRemoteWrite != 0 && access&verbs.AccessLocalWrite == 0:
		return fmt.Errorf("%s: register MR: remote write access requires local write access: %w", p.name, verbs.ErrInvalidArgument)
	}
	return nil
}

// Region is the core of a registered memory region: what the RC rules check of it when
// a work request names it. A provider's MR holds one, immutable once registered.
type Region struct {
	PD     *PD    // the PD the region belongs to
	Buf    []byte // the region's memory
	Addr   uint64 // the address of Buf[0] that work requests name
	Access verbs.AccessFlags
	Owner  any // the provider's MR that holds the region, for the provider's own lookups

	key uint32 // the region's key in its KeyTable, set by Insert
}

// Key returns the region's local and remote key, 0 until a [KeyTable] has given it one.
func (r *Region) Key() uint32 { return r.key }

// Slice returns the bytes [addr, addr+n) of r, or false if they are not all inside r.
func (r *Region) Slice(addr uint64, n uint32) ([]byte, bool) { return Slice(r.Buf, r.Addr, addr, n) }

// Slice returns the bytes [addr, addr+n) of mem, whose first byte is at address base, or
// false if they are not all inside mem. Its result's capacity ends with it, so that an
// append cannot reach past it.
func Slice(mem []byte, base, addr uint64, n uint32) ([]byte, bool) {
	if addr < base {
		return nil, false
	}
	off := addr - base
	if off > uint64(len(mem)) || uint64(n) > uint64(len(mem))-off {
		return nil, false
	}
	return mem[off : off+uint64(n) : off+uint64(n)], true
}

// ResolveLocal checks the local SGL of a work request and appends its buffers to vec:
// each SGE must name a region of pd by its LKey and lie inside it, and with needWrite
// (an RDMA READ, which writes its local buffers) the region must grant local write. It
// returns the buffers, the message's length and WCSuccess, or WCLocProtErr, or
// WCLocLenErr for a message over [MaxMessage].
func ResolveLocal(keys *KeyTable, pd *PD, sgl []verbs.SGE, needWrite bool, vec [][]byte) ([][]byte, uint32, verbs.WCStatus) {
	var total uint64
	for _, s := range sgl {
		total += uint64(s.Length)
		m := keys.Lookup(s.LKey)
		if m == nil || m.PD != pd || (needWrite && m.Access&verbs.AccessLocalWrite == 0) {
			return vec, 0, verbs.WCLocProtErr
		}
		b, ok := m.Slice(s.Addr, s.Length)
		if !ok {
			return vec, 0, verbs.WCLocProtErr
		}
		vec = append(vec, b)
	}
	if total > MaxMessage {
		return vec, 0, verbs.WCLocLenErr
	}
	return vec, uint32(total), verbs.WCSuccess
}

// ResolveRecv checks that a receive WQE whose SGL is sgl can take a message of n bytes
// and appends the buffers the message fills to vec. A message longer than the buffers is
// WCLocLenErr; a buffer that is not locally writable memory of pd is WCLocProtErr. SGEs
// past the message's end are not checked, as a device does not touch them.
func ResolveRecv(keys *KeyTable, pd *PD, sgl []verbs.SGE, n uint32, vec [][]byte) ([][]byte, verbs.WCStatus) {
	var capacity uint64
	for _, s := range sgl {
		capacity += uint64(s.Length)
	}
	if uint64(n) > capacity {
		return vec, verbs.WCLocLenErr
	}
	for _, s := range sgl {
		if n == 0 {
			break
		}
		l := min(n, s.Length)
		m := keys.Lookup(s.LKey)
		if m == nil || m.PD != pd || m.Access&verbs.AccessLocalWrite == 0 {
			return vec, verbs.WCLocProtErr
		}
		b, ok := m.Slice(s.Addr, l)
		if !ok {
			return vec, verbs.WCLocProtErr
		}
		vec = append(vec, b)
		n -= l
	}
	return vec, verbs.WCSuccess
}

// CheckRemote checks a remote access of n bytes at addr with rkey at a responder whose
// QP grants qpAccess and belongs to pd, and returns the target bytes: the QP must grant
// the access need, and rkey must name a region of pd that grants it and holds all n
// bytes. As the InfiniBand specification has it, a zero-length access checks neither key
// nor address (and returns no bytes).
func CheckRemote(keys *KeyTable, pd *PD, qpAccess, need verbs.AccessFlags, rkey uint32, addr uint64, n uint32) ([]byte, bool) {
	if qpAccess&need == 0 {
		return nil, false
	}
	if n == 0 {
		return nil, true
	}
	m := keys.Lookup(rkey)
	if m == nil || m.PD != pd || m.Access&need == 0 {
		return nil, false
	}
	return m.Slice(addr, n)
}
