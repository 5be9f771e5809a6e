package rc

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

func TestCheckRegMR(t *testing.T) {
	const lw, rw, rr = verbs.AccessLocalWrite, verbs.AccessRemoteWrite, verbs.AccessRemoteRead
	tests := []struct {
		length int
		access verbs.AccessFlags
		ok     bool
	}{
		{0, 0, true},
		{100, lw | rw | rr, true},
		{100, rr, true},
		{100, rw, false}, // remote write without local write
		{100, 1 << 7, false},
		{-1, lw, false},
		{101, lw, false}, // over the maximum
	}
	for _, tt := range tests {
		err := testProvider.CheckRegMR(tt.length, 100, tt.access)
		if tt.ok {
			require.NoError(t, err, "CheckRegMR(%d, %#x)", tt.length, tt.access)
			continue
		}
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "CheckRegMR(%d, %#x)", tt.length, tt.access)
		require.Contains(t, err.Error(), "test: register MR")
	}
}

func TestSlice(t *testing.T) {
	mem := make([]byte, 16)
	for i := range mem {
		mem[i] = byte(i)
	}
	const base = 0x1000
	tests := []struct {
		addr uint64
		n    uint32
		want []byte // nil: refused
	}{
		{base, 16, mem},
		{base + 4, 4, mem[4:8]},
		{base + 16, 0, []byte{}},
		{base + 15, 2, nil},
		{base - 1, 1, nil},
		{base + 17, 0, nil},
		{base + 8, 1<<32 - 1, nil}, // the end overflows 32 bits, not 64
		{1<<64 - 1, 2, nil},
	}
	for _, tt := range tests {
		got, ok := Slice(mem, base, tt.addr, tt.n)
		require.Equal(t, tt.want != nil, ok, "Slice(16 bytes at %#x, %#x, %d)", base, tt.addr, tt.n)
		if ok {
			require.Equal(t, tt.want, got, "Slice(16 bytes at %#x, %#x, %d)", base, tt.addr, tt.n)
			require.Equal(t, len(got), cap(got), "capacity of Slice(%#x, %d)", tt.addr, tt.n)
		}
	}
}

// key returns the key a fresh KeyTable gives the i-th region inserted (from 1).
func key(i int) uint32 { return uint32(i) << keyGenBits }

// newKeys returns a fresh KeyTable holding rs, their keys key(1), key(2), ...
func newKeys(t testing.TB, rs ...Region) *KeyTable {
	t.Helper()
	k := new(KeyTable)
	for i := range rs {
		got, err := k.Insert(&rs[i])
		require.NoError(t, err, "Insert")
		require.Equal(t, key(i+1), got, "key of region %d", i+1)
	}
	return k
}

// regions returns a table of regions of 16 bytes each, at 0x1000, 0x2000, ...: keys 1
// (local write) and 2 (read only) of pd, 3 (remote write and read) of pd, 4 of other.
func regions(t testing.TB, pd, other *PD) *KeyTable {
	var rs []Region
	for i, r := range []struct {
		pd     *PD
		access verbs.AccessFlags
	}{
		{pd, verbs.AccessLocalWrite},
		{pd, 0},
		{pd, verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		{other, verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
	} {
		rs = append(rs, Region{PD: r.pd, Buf: make([]byte, 16), Addr: uint64(i+1) << 12, Access: r.access})
	}
	return newKeys(t, rs...)
}

func TestResolveLocal(t *testing.T) {
	pd, other := new(PD), new(PD)
	keys := regions(t, pd, other)
	tests := []struct {
		name      string
		sgl       []verbs.SGE
		needWrite bool
		want      verbs.WCStatus
		wantLen   uint32
		wantBufs  int
	}{
		{"no SGE", nil, false, verbs.WCSuccess, 0, 0},
		{"two regions", []verbs.SGE{{Addr: 0x1000, Length: 8, LKey: key(1)}, {Addr: 0x2004, Length: 4, LKey: key(2)}}, false, verbs.WCSuccess, 12, 2},
		{"read into writable", []verbs.SGE{{Addr: 0x1000, Length: 16, LKey: key(1)}}, true, verbs.WCSuccess, 16, 1},
		{"read into read-only", []verbs.SGE{{Addr: 0x2000, Length: 16, LKey: key(2)}}, true, verbs.WCLocProtErr, 0, 0},
		{"unknown key", []verbs.SGE{{Addr: 0x1000, Length: 1, LKey: key(9)}}, false, verbs.WCLocProtErr, 0, 0},
		{"other PD", []verbs.SGE{{Addr: 0x4000, Length: 1, LKey: key(4)}}, false, verbs.WCLocProtErr, 0, 0},
		{"out of bounds", []verbs.SGE{{Addr: 0x1008, Length: 9, LKey: key(1)}}, false, verbs.WCLocProtErr, 0, 0},
		{"wrong key for address", []verbs.SGE{{Addr: 0x2000, Length: 1, LKey: key(1)}}, false, verbs.WCLocProtErr, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vec, n, st := ResolveLocal(keys, pd, tt.sgl, tt.needWrite, nil)
			require.Equal(t, tt.want, st, "ResolveLocal(%v, needWrite %v)", tt.sgl, tt.needWrite)
			if st == verbs.WCSuccess {
				require.Equal(t, tt.wantLen, n, "length")
				require.Len(t, vec, tt.wantBufs, "buffers")
			}
		})
	}
}

func TestResolveLocalTooLong(t *testing.T) {
	// One region of 2^27 bytes named by 16 SGEs makes a message of 2^31 bytes, the
	// largest; a 17th makes it too long. The region's pages are never touched.
	const size = 1 << 27
	pd := new(PD)
	keys := newKeys(t, Region{PD: pd, Buf: make([]byte, size), Addr: 0x1000, Access: verbs.AccessLocalWrite})
	tests := []struct {
		sges int
		want verbs.WCStatus
	}{
		{16, verbs.WCSuccess},
		{17, verbs.WCLocLenErr},
	}
	for _, tt := range tests {
		sgl := make([]verbs.SGE, tt.sges)
		for i := range sgl {
			sgl[i] = verbs.SGE{Addr: 0x1000, Length: size, LKey: key(1)}
		}
		_, _, st := ResolveLocal(keys, pd, sgl, false, nil)
		require.Equal(t, tt.want, st, "ResolveLocal of %d SGEs of %d bytes", tt.sges, size)
	}
}

func TestResolveRecv(t *testing.T) {
	pd, other := new(PD), new(PD)
	keys := regions(t, pd, other)
	sgl := func(s ...verbs.SGE) []verbs.SGE { return s }
	tests := []struct {
		name     string
		sgl      []verbs.SGE
		n        uint32
		want     verbs.WCStatus
		wantBufs []int // lengths of the buffers filled
	}{
		{"fits one", sgl(verbs.SGE{Addr: 0x1000, Length: 16, LKey: key(1)}), 10, verbs.WCSuccess, []int{10}},
		{"spans two", sgl(verbs.SGE{Addr: 0x1000, Length: 4, LKey: key(1)}, verbs.SGE{Addr: 0x3000, Length: 8, LKey: key(3)}), 10, verbs.WCSuccess, []int{4, 6}},
		{"empty message checks nothing", sgl(verbs.SGE{Addr: 0, Length: 4, LKey: key(9)}), 0, verbs.WCSuccess, nil},
		{"unused SGE not checked", sgl(verbs.SGE{Addr: 0x1000, Length: 4, LKey: key(1)}, verbs.SGE{Addr: 0, Length: 4, LKey: key(9)}), 4, verbs.WCSuccess, []int{4}},
		{"too long", sgl(verbs.SGE{Addr: 0x1000, Length: 4, LKey: key(1)}), 5, verbs.WCLocLenErr, nil},
		{"no SGE", nil, 1, verbs.WCLocLenErr, nil},
		{"read-only buffer", sgl(verbs.SGE{Addr: 0x2000, Length: 4, LKey: key(2)}), 1, verbs.WCLocProtErr, nil},
		{"other PD", sgl(verbs.SGE{Addr: 0x4000, Length: 4, LKey: key(4)}), 1, verbs.WCLocProtErr, nil},
		{"out of bounds", sgl(verbs.SGE{Addr: 0x100c, Length: 8, LKey: key(1)}), 8, verbs.WCLocProtErr, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vec, st := ResolveRecv(keys, pd, tt.sgl, tt.n, nil)
			require.Equal(t, tt.want, st, "ResolveRecv(%v, %d bytes)", tt.sgl, tt.n)
			if st != verbs.WCSuccess {
				return
			}
			var lens []int
			for _, b := range vec {
				lens = append(lens, len(b))
			}
			require.Equal(t, tt.wantBufs, lens, "buffers of ResolveRecv(%v, %d bytes)", tt.sgl, tt.n)
		})
	}
}

func TestCheckRemote(t *testing.T) {
	pd, other := new(PD), new(PD)
	keys := regions(t, pd, other)
	const rw, rr = verbs.AccessRemoteWrite, verbs.AccessRemoteRead
	tests := []struct {
		qpAccess, need verbs.AccessFlags
		rkey           uint32
		addr           uint64
		n              uint32
		ok             bool
	}{
		{rw | rr, rw, key(3), 0x3000, 16, true},
		{rw | rr, rr, key(3), 0x3008, 8, true},
		{rr, rw, key(3), 0x3000, 1, false}, // the QP does not grant it
		{rw, rw, key(1), 0x1000, 1, false}, // the region does not grant it
		{rw, rw, key(4), 0x4000, 1, false}, // another PD's region
		{rw, rw, key(9), 0x3000, 1, false}, // no such key
		{rw, rw, key(3), 0x3008, 9, false}, // out of bounds
		{rw, rw, key(9), 0, 0, true},       // zero length: no key or address check
		{rr, rw, key(3), 0x3000, 0, false}, // but the QP's rights are checked
	}
	for _, tt := range tests {
		name := fmt.Sprintf("CheckRemote(qp %#x, need %#x, rkey %#x, %#x, %d)", tt.qpAccess, tt.need, tt.rkey, tt.addr, tt.n)
		b, ok := CheckRemote(keys, pd, tt.qpAccess, tt.need, tt.rkey, tt.addr, tt.n)
		require.Equal(t, tt.ok, ok, name)
		if ok {
			require.Len(t, b, int(tt.n), name)
		}
	}
}

func TestResolveAllocs(t *testing.T) {
	pd := new(PD)
	keys := regions(t, pd, nil)
	sgl := []verbs.SGE{{Addr: 0x1000, Length: 8, LKey: key(1)}, {Addr: 0x3000, Length: 8, LKey: key(3)}}
	vec := make([][]byte, 0, 2)
	allocs := testing.AllocsPerRun(100, func() {
		ResolveLocal(keys, pd, sgl, false, vec[:0])
		ResolveRecv(keys, pd, sgl, 12, vec[:0])
		CheckRemote(keys, pd, verbs.AccessRemoteWrite, verbs.AccessRemoteWrite, key(3), 0x3000, 8)
	})
	require.Zero(t, allocs, "allocations per resolution")
}
