package testfiles

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTake: with the limit lowered, Take leaves exactly the descriptors asked for, and
// release gives the others back.
func TestTake(t *testing.T) {
	Limit(t, 128)
	release := Take(t, 3)
	var opened []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatalf("open: %v, want EMFILE", err)
			}
			break
		}
		opened = append(opened, f)
	}
	for _, f := range opened {
		f.Close()
	}
	if len(opened) != 3 {
		t.Errorf("Take(t, 3) left %d descriptors", len(opened))
	}
	release()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	f.Close()
}
