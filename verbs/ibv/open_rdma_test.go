//go:build rdma && linux && cgo

package ibv

import (
	"errors"
	"slices"
	"strings"
	"testing"

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
