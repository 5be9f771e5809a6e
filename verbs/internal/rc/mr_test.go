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

// testKeys is a region table: a key names the region at that index, key 0 none.
type testKeys []Region

func (k testKeys) LookupRegion(key uint32) *Region {
	if key == 0 || int(key) >= len(k) {
		return nil
	}
	return &k[key]
}

// regions returns a table of regions of 16 bytes each, at 0x1000, 0x2000, ...: keys 1
// (local write) and 2 (read only) of pd, 3 (remote write and read) of pd, 4 of other.
func regions(pd, other *PD) testKeys {
	k := testKeys{{}}
	for i, r := range []struct {
		pd     *PD
		access verbs.AccessFlags
	}{
		{pd, verbs.AccessLocalWrite},
		{pd, 0},
		{pd, verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		{other, verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
	} {
		k = append(k, Region{PD: r.pd, Buf: make([]byte, 16), Addr: uint64(i+1) << 12, Access: r.access})
	}
	return k
}

func TestResolveLocal(t *testing.T) {
	pd, other := new(PD), new(PD)
	keys := regions(pd, other)
	tests := []struct {
		name      string
		sgl       []verbs.SGE
		needWrite bool
		want      verbs.WCStatus
		wantLen   uint32
		wantBufs  int
	}{
		{"no SGE", nil, false, verbs.WCSuccess, 0, 0},
		{"two regions", []verbs.SGE{{Addr: 0x1000, Length: 8, LKey: 1}, {Addr: 0x2004, Length: 4, LKey: 2}}, false, verbs.WCSuccess, 12, 2},
		{"read into writable", []verbs.SGE{{Addr: 0x1000, Length: 16, LKey: 1}}, true, verbs.WCSuccess, 16, 1},
		{"read into read-only", []verbs.SGE{{Addr: 0x2000, Length: 16, LKey: 2}}, true, verbs.WCLocProtErr, 0, 0},
		{"unknown key", []verbs.SGE{{Addr: 0x1000, Length: 1, LKey: 9}}, false, verbs.WCLocProtErr, 0, 0},
		{"other PD", []verbs.SGE{{Addr: 0x4000, Length: 1, LKey: 4}}, false, verbs.WCLocProtErr, 0, 0},
		{"out of bounds", []verbs.SGE{{Addr: 0x1008, Length: 9, LKey: 1}}, false, verbs.WCLocProtErr, 0, 0},
		{"wrong key for address", []verbs.SGE{{Addr: 0x2000, Length: 1, LKey: 1}}, false, verbs.WCLocProtErr, 0, 0},
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
	keys := testKeys{{}, {PD: pd, Buf: make([]byte, size), Addr: 0x1000, Access: verbs.AccessLocalWrite}}
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
			sgl[i] = verbs.SGE{Addr: 0x1000, Length: size, LKey: 1}
		}
		_, _, st := ResolveLocal(keys, pd, sgl, false, nil)
		require.Equal(t, tt.want, st, "ResolveLocal of %d SGEs of %d bytes", tt.sges, size)
	}
}

func TestResolveRecv(t *testing.T) {
	pd, other := new(PD), new(PD)
	keys := regions(pd, other)
	sgl := func(s ...verbs.SGE) []verbs.SGE { return s }
	tests := []struct {
		name     string
		sgl      []verbs.SGE
		n        uint32
		want     verbs.WCStatus
		wantBufs []int // lengths of the buffers filled
	}{
		{"fits one", sgl(verbs.SGE{Addr: 0x1000, Length: 16, LKey: 1}), 10, verbs.WCSuccess, []int{10}},
		{"spans two", sgl(verbs.SGE{Addr: 0x1000, Length: 4, LKey: 1}, verbs.SGE{Addr: 0x3000, Length: 8, LKey: 3}), 10, verbs.WCSuccess, []int{4, 6}},
		{"empty message checks nothing", sgl(verbs.SGE{Addr: 0, Length: 4, LKey: 9}), 0, verbs.WCSuccess, nil},
		{"unused SGE not checked", sgl(verbs.SGE{Addr: 0x1000, Length: 4, LKey: 1}, verbs.SGE{Addr: 0, Length: 4, LKey: 9}), 4, verbs.WCSuccess, []int{4}},
		{"too long", sgl(verbs.SGE{Addr: 0x1000, Length: 4, LKey: 1}), 5, verbs.WCLocLenErr, nil},
		{"no SGE", nil, 1, verbs.WCLocLenErr, nil},
		{"read-only buffer", sgl(verbs.SGE{Addr: 0x2000, Length: 4, LKey: 2}), 1, verbs.WCLocProtErr, nil},
		{"other PD", sgl(verbs.SGE{Addr: 0x4000, Length: 4, LKey: 4}), 1, verbs.WCLocProtErr, nil},
		{"out of bounds", sgl(verbs.SGE{Addr: 0x100c, Length: 8, LKey: 1}), 8, verbs.WCLocProtErr, nil},
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
	keys := regions(pd, other)
	const rw, rr = verbs.AccessRemoteWrite, verbs.AccessRemoteRead
	tests := []struct {
		qpAccess, need verbs.AccessFlags
		rkey           uint32
		addr           uint64
		n              uint32
		ok             bool
	}{
		{rw | rr, rw, 3, 0x3000, 16, true},
		{rw | rr, rr, 3, 0x3008, 8, true},
		{rr, rw, 3, 0x3000, 1, false}, // the QP does not grant it
		{rw, rw, 1, 0x1000, 1, false}, // the region does not grant it
		{rw, rw, 4, 0x4000, 1, false}, // another PD's region
		{rw, rw, 9, 0x3000, 1, false}, // no such key
		{rw, rw, 3, 0x3008, 9, false}, // out of bounds
		{rw, rw, 9, 0, 0, true},       // zero length: no key or address check
		{rr, rw, 3, 0x3000, 0, false}, // but the QP's rights are checked
	}
	for _, tt := range tests {
		name := fmt.Sprintf("CheckRemote(qp %#x, need %#x, rkey %d, %#x, %d)", tt.qpAccess, tt.need, tt.rkey, tt.addr, tt.n)
		b, ok := CheckRemote(keys, pd, tt.qpAccess, tt.need, tt.rkey, tt.addr, tt.n)
		require.Equal(t, tt.ok, ok, name)
		if ok {
			require.Len(t, b, int(tt.n), name)
		}
	}
}

func TestResolveAllocs(t *testing.T) {
	pd := new(PD)
	keys := Keys(regions(pd, nil))
	sgl := []verbs.SGE{{Addr: 0x1000, Length: 8, LKey: 1}, {Addr: 0x3000, Length: 8, LKey: 3}}
	vec := make([][]byte, 0, 2)
	allocs := testing.AllocsPerRun(100, func() {
		ResolveLocal(keys, pd, sgl, false, vec[:0])
		ResolveRecv(keys, pd, sgl, 12, vec[:0])
		CheckRemote(keys, pd, verbs.AccessRemoteWrite, verbs.AccessRemoteWrite, 3, 0x3000, 8)
	})
	require.Zero(t, allocs, "allocations per resolution")
}
