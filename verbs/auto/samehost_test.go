package auto

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/shm"
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

// TestSameHostRetries: a failure to make the same-host provider (as a process out of
// file descriptors fails to list its interfaces) is returned, not kept: the next call
// makes it, and the calls after that return the one made.
func TestSameHostRetries(t *testing.T) {
	emfile := fmt.Errorf("shm: list interfaces: %w", syscall.EMFILE)
	made := 0
	s := sameHostProvider{create: func() (*shm.Provider, error) {
		made++
		if made == 1 {
			return nil, emfile
		}
		return shm.New(shm.Options{})
	}}
	_, err := s.get()
	require.ErrorIs(t, err, syscall.EMFILE)
	require.ErrorContains(t, err, "auto: same-host provider")
	p, err := s.get()
	require.NoError(t, err, "the second call makes it")
	again, err := s.get()
	require.NoError(t, err)
	require.Same(t, p, again, "and keeps it")
	require.Equal(t, 2, made)
	require.NoError(t, p.(*shm.Provider).Close())
}
