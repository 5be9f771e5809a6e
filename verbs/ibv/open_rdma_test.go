//go:build rdma && linux && cgo

package ibv

import (
	"errors"
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
