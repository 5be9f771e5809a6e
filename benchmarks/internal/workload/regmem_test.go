package workload

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestCountRegisteredKeepsCapabilities checks that the counting wrapper counts what
// RegMR registers, and that a PD able to register caller memory stays able through
// it (uncounted: that memory is the application's), so rsock's direct writes run in
// the benchmarks as they do on the provider.
func TestCountRegisteredKeepsCapabilities(t *testing.T) {
	var r regCounter
	p := countRegistered(soft.New(soft.Options{}), &r)
	ctx, err := p.Open("soft0")
	require.NoError(t, err)
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()

	mr, err := pd.RegMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	require.Equal(t, int64(4096), r.bytes.Load(), "bytes counted after RegMR")

	reg, ok := pd.(verbs.MemoryRegistrar)
	require.True(t, ok, "the wrapped soft PD registers caller memory")
	buf := make([]byte, 8192)
	um, err := reg.RegMemory(buf, verbs.AccessLocalWrite)
	require.NoError(t, err)
	require.Same(t, &buf[0], &um.Bytes()[0])
	require.Equal(t, int64(4096), r.bytes.Load(), "caller memory is not counted")

	require.NoError(t, um.Close())
	require.NoError(t, mr.Close())
	require.Zero(t, r.bytes.Load())
}
