//go:build !(rdma && linux && cgo)

package ibv

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

func TestOpenNotBuilt(t *testing.T) {
	require.False(t, Built)
	p, err := Open()
	require.Nil(t, p)
	require.EqualError(t, err, "ibv: not built with RDMA support (build with -tags rdma)")
	require.ErrorIs(t, err, verbs.ErrNotSupported)
	require.ErrorIs(t, err, ErrNotBuilt)
}
