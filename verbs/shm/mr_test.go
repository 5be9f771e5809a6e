package shm

import (
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
