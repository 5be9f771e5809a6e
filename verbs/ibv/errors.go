package ibv

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/rsockio/rsock/verbs"
)

// ErrNotBuilt is what Open returns in a program built without the rdma build tag (or
// without cgo, or not on Linux). errors.Is(ErrNotBuilt, verbs.ErrNotSupported) holds.
var ErrNotBuilt error = &reasonError{
	msg:  "ibv: not built with RDMA support (build with -tags rdma)",
	kind: verbs.ErrNotSupported,
}

// LibraryError reports that libibverbs could not be loaded: the library is not
// installed, or lacks a function this package needs. A program built with the rdma
// tag still runs on such a machine; it falls back without RDMA.
// errors.Is(err, verbs.ErrNotSupported) holds for it, unless it is Temporary.
type LibraryError struct {
	// Msg says what failed, e.g. "ibv: dlopen libibverbs.so.1: libibverbs.so.1:
	// cannot open shared object file: No such file or directory".
	Msg string
	// Temporary says that the library could not be opened for want of file
	// descriptors or memory ("Too many open files"): a later Open tries again. Such an
	// error matches verbs.ErrNoResources instead of verbs.ErrNotSupported.
	Temporary bool
}

func (e *LibraryError) Error() string { return e.Msg }

// Is makes errors.Is(err, verbs.ErrNotSupported) true, or, for a Temporary error,
// errors.Is(err, verbs.ErrNoResources).
func (e *LibraryError) Is(target error) bool {
	if e.Temporary {
		return target == verbs.ErrNoResources
	}
	return target == verbs.ErrNotSupported
}

// reasonError is an error with its own text that also matches a verbs sentinel.
type reasonError struct {
	msg  string
	kind error
}

func (e *reasonError) Error() string        { return e.msg }
func (e *reasonError) Is(target error) bool { return target == e.kind }

// errClass says which verbs sentinel an errno stands for: the same errno means
// different things from different calls (see the comments on the verbs sentinels).
type errClass int

const (
	classOther   errClass = iota
	classCreate           // alloc, create, reg: ENOMEM is ErrNoResources, EINVAL ErrInvalidArgument
	classModify           // ibv_modify_qp: EINVAL is ErrInvalidState
	classPost             // ibv_post_send/recv: EINVAL is ErrInvalidState, ENOMEM ErrQueueFull
	classDestroy          // dealloc, destroy, dereg: EBUSY is ErrBusy
)

// errnoError turns the errno of a failed libibverbs call into an error that names
// the layer and operation, matches the verbs sentinel the errno stands for, and
// still matches the syscall.Errno: "ibv: create qp: out of resources (ENOMEM)".
func errnoError(op string, err error, class errClass) error {
	var errno syscall.Errno
	if err == nil || (errors.As(err, &errno) && errno == 0) {
		return fmt.Errorf("ibv: %s: failed without an errno", op)
	}
	if errno == 0 {
		return fmt.Errorf("ibv: %s: %w", op, err)
	}
	if kind := errnoKind(errno, class); kind != nil {
		return fmt.Errorf("ibv: %s: %w (%w)", op, kind, namedErrno{errno})
	}
	return fmt.Errorf("ibv: %s: %w", op, errno)
}

// namedErrno shows an errno by its name, after a sentinel that already says what it
// means: "out of resources (ENOMEM)". It unwraps to the syscall.Errno.
type namedErrno struct{ errno syscall.Errno }

var errnoNames = map[syscall.Errno]string{
	syscall.EBUSY:           "EBUSY",
	syscall.EINVAL:          "EINVAL",
	syscall.ENOMEM:          "ENOMEM",
	syscall.ENOSYS:          "ENOSYS",
	syscall.EOPNOTSUPP:      "EOPNOTSUPP",
	syscall.EPROTONOSUPPORT: "EPROTONOSUPPORT",
}

func (e namedErrno) Error() string {
	if name, ok := errnoNames[e.errno]; ok {
		return name
	}
	return e.errno.Error()
}

func (e namedErrno) Unwrap() error { return e.errno }

func errnoKind(errno syscall.Errno, class errClass) error {
	switch errno {
	case syscall.EBUSY:
		return verbs.ErrBusy
	case syscall.EOPNOTSUPP, syscall.ENOSYS, syscall.EPROTONOSUPPORT:
		return verbs.ErrNotSupported
	case syscall.EMFILE, syscall.ENFILE: // the process or the host out of descriptors (opening a device, a channel)
		return verbs.ErrNoResources
	case syscall.EINVAL:
		switch class {
		case classCreate:
			return verbs.ErrInvalidArgument
		case classModify, classPost:
			return verbs.ErrInvalidState
		}
	case syscall.ENOMEM:
		switch class {
		case classCreate:
			return verbs.ErrNoResources
		case classPost:
			return verbs.ErrQueueFull
		}
	}
	return nil
}

// errnoOf recovers the errno of a libibverbs call that returned rc. Most calls return
// the errno value itself ("returns 0 on success, or the value of errno on failure");
// a few return -1 and set errno, which cgo hands over as err; some providers return
// a negated errno.
func errnoOf(rc int, err error) error {
	switch {
	case rc == -1 && err != nil:
		return err
	case rc > 0:
		return syscall.Errno(rc)
	case rc < 0:
		return syscall.Errno(-rc)
	}
	return err
}
