//go:build rdma && linux && cgo

package ibv

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/testfiles"
	"github.com/rsockio/rsock/verbs"
)

// TestOpen checks what Open says on this machine: a provider when a device exists,
// else an error that names the layer and matches the sentinel rsock falls back on.
func TestOpen(t *testing.T) {
	if !Built {
		t.Fatal("Built is false in the rdma build")
	}
	p, err := Open()
	if err == nil {
		t.Logf("ibv.Open: this machine has an RDMA device (provider %s)", p.Name())
		requireGIDTablesMatchSysfs(t, p)
		return
	}
	t.Logf("ibv.Open: %v", err)
	if p != nil {
		t.Errorf("Open() = %v, %v; want a nil provider with the error", p, err)
	}
	if !strings.HasPrefix(err.Error(), "ibv: ") {
		t.Errorf("Open() error %q does not name the layer", err)
	}
	var le *LibraryError
	switch {
	case errors.As(err, &le):
		if !errors.Is(err, verbs.ErrNotSupported) {
			t.Errorf("Open() error %q: a LibraryError must match verbs.ErrNotSupported", err)
		}
	case !errors.Is(err, verbs.ErrNoDevice):
		t.Errorf("Open() error %q matches neither verbs.ErrNoDevice nor a *LibraryError", err)
	}
}

// requireGIDTablesMatchSysfs checks, on a machine with a device, that the GID tables the
// provider reports (from ibv_query_gid_table where libibverbs and the kernel have it)
// are the ones sysfs holds: the same populated entries, at the same hardware indices,
// with the same types and netdevs.
func requireGIDTablesMatchSysfs(t *testing.T, p verbs.Provider) {
	t.Logf("ibv_query_gid_table in libibverbs: %v", haveQueryGIDTable())
	devs, err := p.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	for _, d := range devs {
		for _, port := range d.Ports {
			want, err := ReadGIDTable(DefaultSysfsRoot, d.Name, port.Num)
			if err != nil {
				t.Fatalf("ReadGIDTable(%s, %d): %v", d.Name, port.Num, err)
			}
			if !slices.Equal(port.GIDs, want) {
				t.Errorf("%s port %d: GID table %+v, sysfs holds %+v", d.Name, port.Num, port.GIDs, want)
			}
			t.Logf("%s port %d: %d populated GID entries", d.Name, port.Num, len(port.GIDs))
		}
	}
}

// TestDevicesOutOfFiles lists this machine's devices, and opens the first, with 0, 1,
// 2 … descriptors free, in a child process whose descriptor limit it lowers. Each
// listing is whole (what a listing with descriptors to spare returns) or fails with
// EMFILE and matches verbs.ErrNoResources, never verbs.ErrNoDevice: libibverbs leaves
// out a device whose sysfs files it cannot read, and a listing short of a descriptor
// must not read as a host without RDMA. It needs a device (rxe in the CI's VM); the
// fake library's no-files scenario covers the same paths without one.
func TestDevicesOutOfFiles(t *testing.T) {
	if _, err := Open(); err != nil {
		t.Skipf("no RDMA device here (TestFakeLibibverbs covers the path): %v", err)
	}
	runChild(t, "", "real-files")
}

// realDevicesOutOfFiles is TestDevicesOutOfFiles in its child process.
func realDevicesOutOfFiles(t *testing.T) {
	p, err := Open()
	require.NoError(t, err)
	want, err := p.Devices()
	require.NoError(t, err)
	require.NotEmpty(t, want)
	testfiles.Limit(t, 256)
	failed := 0
	for free := range 12 {
		release := testfiles.Take(t, free)
		got, listErr := p.Devices()
		ctx, openErr := p.Open(want[0].Name)
		release()
		if ctx != nil {
			require.NoError(t, ctx.Close())
		}
		for _, err := range []error{listErr, openErr} {
			if err != nil {
				require.ErrorIs(t, err, verbs.ErrNoResources, "%d free", free)
				require.NotErrorIs(t, err, verbs.ErrNoDevice, "%d free", free)
				require.True(t, errors.Is(err, syscall.EMFILE) || strings.Contains(err.Error(), "too many open files"),
					"%d free: the error names the want of descriptors: %v", free, err)
			}
		}
		if listErr != nil {
			failed++
			t.Logf("%d free: %v", free, listErr)
			continue
		}
		require.Equal(t, want, got, "%d free: a listing that succeeds is whole", free)
		t.Logf("%d free: %d devices listed", free, len(got))
	}
	require.NotZero(t, failed, "with no descriptor free, the listing fails")
	require.Less(t, failed, 12, "with descriptors free, the listing succeeds")
}
