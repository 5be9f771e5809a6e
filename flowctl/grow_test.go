package flowctl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGrowWQEsRejects(t *testing.T) {
	tests := []struct {
		name   string
		growTo int
		n      int
	}{
		{"zero", 16, 0},
		{"negative", 16, -1},
		{"past GrowWQEsTo", 16, 9},
		{"a side that never grows", 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewEndpoint(Params{RingSize: MinRingSize, RecvWQEs: 8, GrowWQEsTo: tt.growTo}, Params{RingSize: MinRingSize, RecvWQEs: 8})
			require.NoError(t, err)
			require.ErrorIs(t, e.GrowWQEs(tt.n), ErrBadParams)
			require.Equal(t, 8, e.WQEs(), "a refused growth changes nothing")
			require.Zero(t, e.OwedWQEs())
		})
	}
}

// TestGrowWQEsCredit: the WQEs added go to the peer as credit in the next message, due
// at once for a doubling, and the peer's limit grows by them.
func TestGrowWQEsCredit(t *testing.T) {
	p := Params{RingSize: MinRingSize, RecvWQEs: 8, GrowWQEsTo: 32}
	rx, err := NewEndpoint(p, p)
	require.NoError(t, err)
	tx, err := NewEndpoint(p, p)
	require.NoError(t, err)

	require.NoError(t, rx.GrowWQEs(8))
	require.Equal(t, 16, rx.WQEs())
	require.Equal(t, 8, rx.OwedWQEs())
	m, ok := rx.NextControl()
	require.True(t, ok, "doubling makes an update due")
	imm, err := DecodeImm(m.Imm, 0)
	require.NoError(t, err)
	require.Equal(t, KindCredit, imm.Kind)
	require.EqualValues(t, 8, imm.WQECredits)

	before := tx.credit()
	a, err := tx.OnArrival(0, m.Imm)
	require.NoError(t, err)
	require.True(t, a.Credited)
	require.Equal(t, before+8, tx.credit())
	require.EqualValues(t, 16, tx.peerWQEs)

	// The update threshold scaled: half of 16 owed makes the next one due, not four.
	require.NoError(t, rx.GrowWQEs(1))
	_, ok = rx.NextControl()
	require.False(t, ok, "one WQE owed of 17")
	require.EqualValues(t, 8, rx.pol.wqeUpdate)
}

// TestGrowWQEsPeerLimit: a peer takes credit beyond its messages only up to the growth
// the receiver's Params allow, and not at all from a receiver that never grows.
func TestGrowWQEsPeerLimit(t *testing.T) {
	tests := []struct {
		name      string
		growTo    int
		surplus   uint32
		wantError bool
	}{
		{"within GrowWQEsTo", 24, 16, false},
		{"past GrowWQEsTo", 24, 17, true},
		{"from a peer that never grows", 0, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			local := Params{RingSize: MinRingSize, RecvWQEs: 8}
			tx, err := NewEndpoint(local, Params{RingSize: MinRingSize, RecvWQEs: 8, GrowWQEsTo: tt.growTo})
			require.NoError(t, err)
			r, err := tx.ReserveData(10)
			require.NoError(t, err)
			require.Equal(t, 1, r.Count)
			_, err = tx.OnArrival(0, imm(KindCredit, 1+tt.surplus, 0))
			if tt.wantError {
				require.ErrorIs(t, err, ErrCreditOverflow)
				return
			}
			require.NoError(t, err)
			require.EqualValues(t, 8+tt.surplus, tx.peerWQEs)
		})
	}
}

// TestGrowWQEsOverrun: the receiver holds the peer to the WQEs it returned credit
// for; WQEs added and not yet returned do not count.
func TestGrowWQEsOverrun(t *testing.T) {
	p := Params{RingSize: MinRingSize, RecvWQEs: 4, GrowWQEsTo: 8}
	rx, err := NewEndpoint(p, p)
	require.NoError(t, err)
	require.NoError(t, rx.GrowWQEs(4))
	for range 4 {
		_, err := rx.OnArrival(0, imm(KindKeepalive, 0, 0))
		require.NoError(t, err)
	}
	_, err = rx.OnArrival(0, imm(KindKeepalive, 0, 0))
	require.ErrorIs(t, err, ErrWQEOverrun, "a fifth message before any credit went back")
}
