package workload

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/shm"
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

// TestCountRegisteredKeepsLocalRegistrar is TestCountRegisteredKeepsCapabilities for a
// PD that registers caller memory for local access only (shm).
func TestCountRegisteredKeepsLocalRegistrar(t *testing.T) {
	sp, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, sp.Close()) }()
	var r regCounter
	ctx, err := countRegistered(sp, &r).Open("shm0")
	require.NoError(t, err)
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()

	_, full := pd.(verbs.MemoryRegistrar)
	require.False(t, full, "the wrapper adds no capability")
	reg, ok := pd.(verbs.LocalMemoryRegistrar)
	require.True(t, ok, "the wrapped shm PD registers caller memory for local access")
	buf := make([]byte, 8192)
	um, err := reg.RegLocalMemory(buf, verbs.AccessLocalWrite)
	require.NoError(t, err)
	require.Same(t, &buf[0], &um.Bytes()[0])
	require.Zero(t, r.bytes.Load(), "caller memory is not counted")
	require.NoError(t, um.Close())
}
