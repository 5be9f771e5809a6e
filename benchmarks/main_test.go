package benchmarks

import (
	"testing"

	"github.com/rsockio/rsock/internal/harness"
)

// TestMain fails the package's tests if a goroutine outlives them, once rsock's idle
// devices are closed.
func TestMain(m *testing.M) { harness.VerifyTestMain(m) }
