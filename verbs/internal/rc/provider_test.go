package rc

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

func TestProviderErrors(t *testing.T) {
	p := NewProvider("test")
	require.Equal(t, "test", p.Name())
	tests := []struct {
		err  error
		is   error
		text string
	}{
		{p.errPollClosed, verbs.ErrClosed, "test: poll CQ: "},
		{p.errPollOverflow, verbs.ErrCQOverflow, "test: poll CQ: "},
	}
	for _, tt := range tests {
		require.True(t, errors.Is(tt.err, tt.is), "%v is not %v", tt.err, tt.is)
		require.Contains(t, tt.err.Error(), tt.text)
	}
}
