//go:build rdma && linux && cgo

package ibv

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

func init() { fakeScenarios["user-memory"] = fakeUserMemory }

// fakeUserMemory runs RegMemory against the libibverbs test double, as a scenario of
// TestFakeLibibverbs: a Write posted from Go memory the caller owns lands in the peer's
// region, with the caller's buffer registered in place, not copied.
func fakeUserMemory(t *testing.T) {
	sysfsRoot = "testdata/sysfs-fake"

	t.Run("write from caller memory", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1})
		defer r.close(t)
		reg, ok := r.pd.(verbs.MemoryRegistrar)
		require.True(t, ok, "ibv's PD implements verbs.MemoryRegistrar")
		buf := make([]byte, 3000)
		copy(buf[1000:], "from the caller's own buffer")
		m, err := reg.RegMemory(buf, verbs.AccessLocalWrite)
		require.NoError(t, err)
		require.Equal(t, &buf[0], &m.Bytes()[0], "Bytes is buf itself")
		require.Len(t, m.Bytes(), len(buf))
		require.Equal(t, verbs.AccessLocalWrite, m.Access())

		require.NoError(t, r.b.PostRecv([]verbs.RecvWR{{ID: 1}}))
		require.NoError(t, r.a.PostSend([]verbs.SendWR{{
			ID: 2, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 9,
			SGL:        []verbs.SGE{{Addr: m.Addr() + 1000, Length: 28, LKey: m.LKey()}},
			RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey(),
		}}))
		sent := pollOne(t, r.cqA)
		require.NoError(t, sent.Err())
		wc := pollOne(t, r.cqB)
		require.Equal(t, uint32(28), wc.ByteLen)
		require.Equal(t, "from the caller's own buffer", string(r.mrB.Bytes()[:28]))

		require.NoError(t, m.Close())
		require.ErrorIs(t, m.Close(), verbs.ErrClosed, "second Close")
		require.Nil(t, m.Bytes(), "a closed region lets go of the caller's memory")
		require.Equal(t, byte('f'), buf[1000], "Close leaves the caller's memory alone")
	})

	t.Run("arguments", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1})
		defer r.close(t)
		reg := r.pd.(verbs.MemoryRegistrar)
		for _, tc := range []struct {
			name   string
			buf    []byte
			access verbs.AccessFlags
		}{
			{"nil buffer", nil, verbs.AccessLocalWrite},
			{"empty buffer", make([]byte, 0, 8), verbs.AccessLocalWrite},
			{"unknown access flag", make([]byte, 8), 1 << 20},
			{"remote write without local write", make([]byte, 8), verbs.AccessRemoteWrite},
		} {
			m, err := reg.RegMemory(tc.buf, tc.access)
			require.ErrorIs(t, err, verbs.ErrInvalidArgument, "%s: RegMemory(%d bytes, %#x)", tc.name, len(tc.buf), tc.access)
			require.Nil(t, m, tc.name)
		}
	})

	t.Run("closed protection domain", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1})
		reg := r.pd.(verbs.MemoryRegistrar)
		m, err := reg.RegMemory(make([]byte, 64), verbs.AccessLocalWrite)
		require.NoError(t, err)
		require.ErrorIs(t, r.pd.Close(), verbs.ErrBusy, "a registered buffer keeps the PD")
		require.NoError(t, m.Close())
		r.close(t)
		_, err = reg.RegMemory(make([]byte, 64), verbs.AccessLocalWrite)
		require.ErrorIs(t, err, verbs.ErrClosed)
	})
}
