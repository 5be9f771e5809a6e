package ibv

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

func TestErrnoError(t *testing.T) {
	tests := []struct {
		op       string
		err      error
		class    errClass
		want     string
		sentinel error
	}{
		{"create qp", syscall.ENOMEM, classCreate, "ibv: create qp: out of resources (ENOMEM)", verbs.ErrNoResources},
		{"create qp", syscall.EINVAL, classCreate, "ibv: create qp: invalid argument (EINVAL)", verbs.ErrInvalidArgument},
		{"post send", syscall.ENOMEM, classPost, "ibv: post send: work queue full (ENOMEM)", verbs.ErrQueueFull},
		{"post send", syscall.EINVAL, classPost, "ibv: post send: invalid QP state for this operation (EINVAL)", verbs.ErrInvalidState},
		{"modify qp 0x12 to RTR", syscall.EINVAL, classModify, "ibv: modify qp 0x12 to RTR: invalid QP state for this operation (EINVAL)", verbs.ErrInvalidState},
		{"destroy cq", syscall.EBUSY, classDestroy, "ibv: destroy cq: resource in use (EBUSY)", verbs.ErrBusy},
		{"open device mlx5_0", syscall.EMFILE, classCreate, "ibv: open device mlx5_0: out of resources (too many open files)", verbs.ErrNoResources},
		{"create comp channel", syscall.ENFILE, classOther, "ibv: create comp channel: out of resources (too many open files in system)", verbs.ErrNoResources},
		{"create cq", syscall.EOPNOTSUPP, classCreate, "ibv: create cq: operation not supported (EOPNOTSUPP)", verbs.ErrNotSupported},
		{"query port 1 of mlx5_0", syscall.EIO, classOther, "ibv: query port 1 of mlx5_0: input/output error", nil},
		{"alloc pd", nil, classCreate, "ibv: alloc pd: failed without an errno", nil},
		{"alloc pd", syscall.Errno(0), classCreate, "ibv: alloc pd: failed without an errno", nil},
	}
	for _, tt := range tests {
		got := errnoError(tt.op, tt.err, tt.class)
		if got.Error() != tt.want {
			t.Errorf("errnoError(%q, %v, %d) = %q, want %q", tt.op, tt.err, tt.class, got, tt.want)
		}
		if tt.sentinel != nil && !errors.Is(got, tt.sentinel) {
			t.Errorf("errnoError(%q, %v, %d) = %q, does not match %v", tt.op, tt.err, tt.class, got, tt.sentinel)
		}
		var errno syscall.Errno
		if errors.As(tt.err, &errno) && errno != 0 && !errors.Is(got, errno) {
			t.Errorf("errnoError(%q, %v, %d) = %q, does not match the errno", tt.op, tt.err, tt.class, got)
		}
	}
}

func TestErrnoOf(t *testing.T) {
	tests := []struct {
		rc   int
		err  error
		want error
	}{
		{12, nil, syscall.ENOMEM},           // returns the errno value
		{-22, nil, syscall.EINVAL},          // a provider returning -errno
		{-1, syscall.EBUSY, syscall.EBUSY},  // returns -1 and sets errno
		{-1, nil, syscall.EPERM},            // -1 without errno: the value itself
		{0, syscall.EAGAIN, syscall.EAGAIN}, // NULL return: errno from cgo
	}
	for _, tt := range tests {
		if got := errnoOf(tt.rc, tt.err); got != tt.want {
			t.Errorf("errnoOf(%d, %v) = %v, want %v", tt.rc, tt.err, got, tt.want)
		}
	}
}

func TestLibraryError(t *testing.T) {
	err := error(&LibraryError{Msg: "ibv: dlopen libibverbs.so.1: not found"})
	require.ErrorIs(t, err, verbs.ErrNotSupported)
	require.NotErrorIs(t, err, verbs.ErrNoResources)
	require.EqualError(t, err, "ibv: dlopen libibverbs.so.1: not found")

	// Out of file descriptors: it may pass, so it is not "not supported".
	err = &LibraryError{Msg: "ibv: dlopen libibverbs.so.1: Too many open files", Temporary: true}
	require.ErrorIs(t, err, verbs.ErrNoResources)
	require.NotErrorIs(t, err, verbs.ErrNotSupported)
}
