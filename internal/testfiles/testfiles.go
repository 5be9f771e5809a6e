// Package testfiles runs a test process out of file descriptors, for the tests of what
// rsock and its providers do when opening a file, a socket or a library fails with
// EMFILE. Its functions change the whole process: tests call them in a child process
// of their own (a re-executed test binary).
package testfiles

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// Limit lowers the process's RLIMIT_NOFILE soft limit to at most n, so that Take opens
// few files. It is not undone.
func Limit(t testing.TB, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("testfiles: get RLIMIT_NOFILE: %v", err)
	}
	lim.Cur = min(lim.Cur, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("testfiles: lower RLIMIT_NOFILE to %d: %v", n, err)
	}
}

// Take opens /dev/null until the process is out of descriptors, then closes free of
// them, so that free descriptors are left; release closes the others.
func Take(t testing.TB, free int) (release func()) {
	t.Helper()
	var taken []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatalf("testfiles: taking descriptors: %v", err)
			}
			break
		}
		taken = append(taken, f)
	}
	for range min(free, len(taken)) {
		taken[len(taken)-1].Close()
		taken = taken[:len(taken)-1]
	}
	return func() {
		for _, f := range taken {
			f.Close()
		}
	}
}
