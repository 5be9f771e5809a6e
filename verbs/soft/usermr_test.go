package soft_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestRegMemory checks that caller memory registered with RegMemory serves as the
// source of a local send and as the target of a remote write, that its region is the
// caller's slice (not a copy), and that closing the region leaves the memory alone and
// makes its key name nothing.
func TestRegMemory(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 2})
	a, b := connectPair(t, f, pairOpts{})
	reg := func(s *side, buf []byte, acc verbs.AccessFlags) verbs.MR {
		r, ok := s.pd.(verbs.MemoryRegistrar)
		require.True(t, ok, "soft PDs register caller memory")
		mr, err := r.RegMemory(buf, acc)
		require.NoError(t, err)
		return mr
	}
	src := bytes.Repeat([]byte("zero-copy "), 100)
	dst := make([]byte, 2*len(src))
	srcMR := reg(a, src, verbs.AccessLocalWrite)
	dstMR := reg(b, dst, access)
	require.Same(t, &src[0], &srcMR.Bytes()[0], "the region is the caller's memory")

	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	wr := writeImm(7, srcMR, dstMR, 0, len(src))
	wr.RemoteAddr = dstMR.Addr() + 3
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}))
	require.Equal(t, verbs.WCSuccess, poll(t, a.scq, 1)[0].Status)
	require.Equal(t, verbs.WCSuccess, poll(t, b.rcq, 1)[0].Status)
	require.Equal(t, src, dst[3:3+len(src)], "the bytes landed in the caller's memory")

	require.NoError(t, srcMR.Close())
	require.Equal(t, "zero-copy ", string(src[:10]), "Close frees nothing")
	wr.ID = 8
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}))
	require.Equal(t, verbs.WCLocProtErr, poll(t, a.scq, 1)[0].Status, "a closed region's key names nothing")
	require.NoError(t, dstMR.Close())
}

// TestRegMemoryRejects checks the argument checks RegMemory shares with RegMR.
func TestRegMemoryRejects(t *testing.T) {
	f := newFabric(t, soft.Options{Devices: 1, Limits: soft.Limits{MaxMRSize: 1 << 10}})
	ctx, err := f.Open("soft0")
	require.NoError(t, err)
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	r := pd.(verbs.MemoryRegistrar)
	for _, tc := range []struct {
		name   string
		size   int
		access verbs.AccessFlags
	}{
		{"too large", 1<<10 + 1, verbs.AccessLocalWrite},
		{"unknown flag", 16, 1 << 9},
		{"remote write without local write", 16, verbs.AccessRemoteWrite},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr, err := r.RegMemory(make([]byte, tc.size), tc.access)
			require.ErrorIs(t, err, verbs.ErrInvalidArgument, "RegMemory(%d bytes, %#x)", tc.size, tc.access)
			require.Nil(t, mr)
		})
	}
}
