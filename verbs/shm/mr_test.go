package shm

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/verbs"
)

func TestRegMRArguments(t *testing.T) {
	p := newProvider(t, 1)
	e := newEnd(t, p, "shm0", 4096)
	tests := []struct {
		length int
		access verbs.AccessFlags
		ok     bool
	}{
		{0, verbs.AccessLocalWrite, true},
		{1, 0, true},
		{1 << 20, validAccess, true},
		{-1, 0, false},
		{maxRegionSize + 1, 0, false},
		{8, verbs.AccessRemoteWrite, false}, // remote write needs local write
		{8, 1 << 5, false},
	}
	for _, tt := range tests {
		m, err := e.pd.RegMR(tt.length, tt.access)
		if !tt.ok {
			require.ErrorIs(t, err, verbs.ErrInvalidArgument, "RegMR(%d, %#x)", tt.length, tt.access)
			continue
		}
		require.NoError(t, err, "RegMR(%d, %#x)", tt.length, tt.access)
		require.Len(t, m.Bytes(), tt.length)
		require.NoError(t, m.Close())
		require.ErrorIs(t, m.Close(), verbs.ErrClosed)
	}
}

// TestMapPeerRegion: a region a peer passes is mapped only if it cannot fault (a memfd
// sealed against shrinking, holding the bytes it claims), and writable only if the
// descriptor is.
func TestMapPeerRegion(t *testing.T) {
	p := newProvider(t, 1)
	e := newEnd(t, p, "shm0", 4096)
	readOnly, err := e.pd.RegMR(8192, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	require.NoError(t, err)
	defer readOnly.Close()
	tests := []struct {
		name     string
		fd       func() int
		size     uint64
		ok       bool
		writable bool
	}{
		{"Writable", func() int { fd, _ := e.mr.(*MR).shareFD(); return fd }, 4096, true, true},
		{"ReadOnly", func() int { fd, _ := readOnly.(*MR).shareFD(); return fd }, 8192, true, false},
		{"Smaller", func() int { return sealedMemfd(t, 4096, true) }, 100, true, true},
		{"Empty", func() int { return sealedMemfd(t, 4096, true) }, 0, true, true},
		{"Unsealed", func() int { return sealedMemfd(t, 4096, false) }, 4096, false, false},
		{"Short", func() int { return sealedMemfd(t, 4096, true) }, 4097, false, false},
		{"Huge", func() int { return sealedMemfd(t, 4096, true) }, maxRegionSize + 1, false, false},
		{"File", func() int {
			f, err := os.CreateTemp(t.TempDir(), "region")
			require.NoError(t, err)
			require.NoError(t, f.Truncate(4096))
			fd, err := unix.Dup(int(f.Fd()))
			require.NoError(t, err)
			f.Close()
			return fd
		}, 4096, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held := vma.Held()
			mem, writable, err := mapPeerRegion(tt.fd(), tt.size, nil)
			if !tt.ok {
				require.Error(t, err, "mapPeerRegion of %d bytes", tt.size)
				require.Equal(t, held, vma.Held(), "a refused region counts no mapping")
				return
			}
			require.NoError(t, err)
			require.Len(t, mem, int(tt.size))
			require.Equal(t, tt.writable, writable, "writable")
			require.Equal(t, held+1, vma.Held(), "mapped")
			unmap(mem, nil) // an empty region's mapping too: it was left mapped
			require.Equal(t, held, vma.Held(), "unmapped")
		})
	}
}

// TestSharedRegion: the peer's mapping and the owner's region are the same memory.
func TestSharedRegion(t *testing.T) {
	p := newProvider(t, 1)
	e := newEnd(t, p, "shm0", 4096)
	fd, err := e.mr.(*MR).shareFD()
	require.NoError(t, err)
	mem, _, err := mapPeerRegion(fd, 4096, nil)
	require.NoError(t, err)
	defer unmap(mem, nil)
	copy(mem, "from the peer")
	require.Equal(t, "from the peer", string(e.mr.Bytes()[:13]))
}

// TestRegLocalMemory: caller memory registered with RegLocalMemory is the source of an
// RDMA WRITE and of a SEND, and the sink of a receive, as the caller's own slice (not a
// copy); remote access is refused, at registration and to a peer naming its key; Close
// leaves the memory alone and makes the key name nothing.
func TestRegLocalMemory(t *testing.T) {
	p := newProvider(t, 2)
	a, b := newEnd(t, p, "shm0", 4096), newEnd(t, p, "shm1", 4096)
	connectEnds(t, a, b, 14, 7)
	reg := func(e *end, buf []byte) verbs.MR {
		t.Helper()
		mr, err := e.pd.(verbs.LocalMemoryRegistrar).RegLocalMemory(buf, verbs.AccessLocalWrite)
		require.NoError(t, err)
		return mr
	}
	src := bytes.Repeat([]byte("caller's  "), 100)
	srcMR := reg(a, src)
	require.Same(t, &src[0], &srcMR.Bytes()[0], "the region is the caller's memory")

	// RDMA WRITE_WITH_IMM from the caller's memory into b's shared region.
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, srcMR, b.mr, 0, len(src))}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, a.cq, 1)[0].Status)
	require.Equal(t, verbs.WCSuccess, pollWait(t, b.cq, 1)[0].Status)
	require.Equal(t, src, b.mr.Bytes()[:len(src)], "written from the caller's memory")

	// SEND from the caller's memory into a receive WQE naming b's caller memory.
	dst := make([]byte, 2*len(src))
	dstMR := reg(b, dst)
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 2, SGL: []verbs.SGE{{Addr: dstMR.Addr() + 5, Length: uint32(len(src)), LKey: dstMR.LKey()}}}}))
	copy(src, "sent now, ")
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: srcMR.Addr(), Length: uint32(len(src)), LKey: srcMR.LKey()}}}}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, a.cq, 1)[0].Status)
	wc := pollWait(t, b.cq, 1)[0]
	require.Equal(t, verbs.WCSuccess, wc.Status)
	require.Equal(t, uint32(len(src)), wc.ByteLen)
	require.Equal(t, src, dst[5:5+len(src)], "received into the caller's memory")

	// A peer naming a local-only region's key is refused: no descriptor is shared.
	write := writeImm(3, srcMR, dstMR, 0, 10)
	write.Opcode = verbs.OpRDMAWrite // no receive WQE needed: the refusal is all that answers
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{write}))
	require.Equal(t, verbs.WCRemAccessErr, pollWait(t, a.cq, 1)[0].Status)
	require.Equal(t, byte(0), dst[0], "nothing landed")

	require.NoError(t, dstMR.Close())
	require.Equal(t, "sent now, ", string(dst[5:15]), "Close frees nothing")
	require.ErrorIs(t, dstMR.Close(), verbs.ErrClosed)
	require.NoError(t, srcMR.Close())
}

// TestRegLocalMemoryArguments: RegMR's checks, and no remote access.
func TestRegLocalMemoryArguments(t *testing.T) {
	p := newProvider(t, 1)
	e := newEnd(t, p, "shm0", 4096)
	r := e.pd.(verbs.LocalMemoryRegistrar)
	_, isFull := e.pd.(verbs.MemoryRegistrar)
	require.False(t, isFull, "shm cannot let peers reach caller memory")
	for _, tt := range []struct {
		name   string
		buf    []byte
		access verbs.AccessFlags
		ok     bool
	}{
		{"local write", make([]byte, 10), verbs.AccessLocalWrite, true},
		{"no access", make([]byte, 10), 0, true},
		{"empty", nil, verbs.AccessLocalWrite, true},
		{"remote write", make([]byte, 10), verbs.AccessLocalWrite | verbs.AccessRemoteWrite, false},
		{"remote read", make([]byte, 10), verbs.AccessRemoteRead, false},
		{"unknown flag", make([]byte, 10), 1 << 5, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.RegLocalMemory(tt.buf, tt.access)
			if !tt.ok {
				require.ErrorIs(t, err, verbs.ErrInvalidArgument)
				return
			}
			require.NoError(t, err)
			require.Len(t, m.Bytes(), len(tt.buf))
			_, err = m.(*MR).shareFD()
			require.ErrorIs(t, err, verbs.ErrInvalidArgument, "never shared")
			require.NoError(t, m.Close())
		})
	}
}

// TestRegLocalMemoryLeavesLastQuarter: caller memory takes at most maxLocalMR of the
// device's MRs, all regions counted, so RegMR still registers past it.
func TestRegLocalMemoryLeavesLastQuarter(t *testing.T) {
	p := newProvider(t, 1)
	e := newEnd(t, p, "shm0", 4096) // one RegMR region
	r := e.pd.(verbs.LocalMemoryRegistrar)
	buf := make([]byte, 64)
	var mrs []verbs.MR
	defer func() {
		for _, m := range mrs {
			require.NoError(t, m.Close())
		}
	}()
	for range maxLocalMR - 1 {
		m, err := r.RegLocalMemory(buf, verbs.AccessLocalWrite)
		require.NoError(t, err)
		mrs = append(mrs, m)
	}
	_, err := r.RegLocalMemory(buf, verbs.AccessLocalWrite)
	require.ErrorIs(t, err, verbs.ErrNoResources, "caller memory past maxLocalMR")
	m, err := e.pd.RegMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err, "RegMR past maxLocalMR")
	require.NoError(t, m.Close())
	require.NoError(t, mrs[0].Close())
	mrs = mrs[1:]
	m, err = r.RegLocalMemory(buf, verbs.AccessLocalWrite)
	require.NoError(t, err, "caller memory once one was closed")
	mrs = append(mrs, m)
}
