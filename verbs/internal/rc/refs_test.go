package rc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

func TestRefs(t *testing.T) {
	tests := []struct {
		name     string
		acquire  int // dependents acquired
		release  int // then released
		closeErr error
	}{
		{"unused", 0, 0, nil},
		{"in use", 2, 1, verbs.ErrBusy},
		{"all released", 2, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Refs
			for range tt.acquire {
				require.NoError(t, r.Acquire())
			}
			for range tt.release {
				r.Release()
			}
			err := r.Close()
			require.ErrorIs(t, err, tt.closeErr, "Close after %d acquires and %d releases", tt.acquire, tt.release)
			if tt.closeErr != nil {
				return
			}
			require.ErrorIs(t, r.Acquire(), verbs.ErrClosed, "Acquire after Close")
			require.ErrorIs(t, r.Close(), verbs.ErrClosed, "second Close")
		})
	}
}
