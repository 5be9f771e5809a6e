package shm

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/verbstest"
)

func TestMain(m *testing.M) {
	if runAgentIfAsked() { // the peer process of the two-process tests
		return
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(exitIfMappingsHeld))
}

// exitIfMappingsHeld exits with code, or with 1 when the tests passed but left memory
// mappings counted (internal/vma): a mapping some path forgot to give back, which
// would in time refuse every same-host connection of a long-lived process.
func exitIfMappingsHeld(code int) {
	if h := vma.Held(); h != 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "shm: the tests passed but left %d memory mappings counted\n", h)
		code = 1
	}
	os.Exit(code)
}

// newProvider returns a provider with n devices, closed when the test ends.
func newProvider(t *testing.T, n int) *Provider {
	t.Helper()
	p, err := New(Options{Devices: n})
	if err != nil {
		t.Fatalf("New(%d devices) = %v", n, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestConformance runs the conformance suite with both ends of every pair in this
// process, on two devices that talk through their sockets as two processes would.
func TestConformance(t *testing.T) {
	verbstest.Run(t, func(t *testing.T) verbs.Provider { return newProvider(t, 2) })
}
