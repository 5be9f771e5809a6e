package auto

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSameHost(t *testing.T) {
	p, err := SameHost()
	require.NoError(t, err)
	require.Equal(t, "shm", p.Name())
	again, err := SameHost()
	require.NoError(t, err)
	require.Same(t, p, again, "one provider for the process")
	devs, err := p.Devices()
	require.NoError(t, err)
	require.NotEmpty(t, devs)
}
