package rdma

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStopCtx: a stopCtx is a context that has no deadline nor values and ends, with
// context.Canceled, when its channel is closed, for itself and the contexts derived
// from it; handing it over as a context.Context allocates nothing.
func TestStopCtx(t *testing.T) {
	for _, tc := range []struct {
		name    string
		closed  bool
		wantErr error
	}{
		{name: "open", wantErr: nil},
		{name: "closed", closed: true, wantErr: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStopCtx()
			child, cancel := context.WithCancel(s)
			defer cancel()
			if tc.closed {
				close(s)
				<-child.Done() // the child ends with its parent
			}
			var ctx context.Context = s
			require.Equal(t, tc.wantErr, ctx.Err(), "Err")
			require.Equal(t, tc.wantErr, child.Err(), "the child's Err")
			select {
			case <-ctx.Done():
				require.True(t, tc.closed, "Done closed while the stopCtx is open")
			default:
				require.False(t, tc.closed, "Done open after the stopCtx closed")
			}
			_, ok := ctx.Deadline()
			require.False(t, ok, "a stopCtx has a deadline")
			require.Nil(t, ctx.Value("key"), "Value")
		})
	}
}
