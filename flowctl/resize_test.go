package flowctl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestResizeRejects covers the sizes and states in which Resize refuses.
func TestResizeRejects(t *testing.T) {
	p := Params{RingSize: 16 << 10, RecvWQEs: 64}
	big := Params{RingSize: 1 << 20, RecvWQEs: 64}                           // 2-byte ring unit
	fixed := Params{RingSize: 16 << 10, RecvWQEs: 64, UnitRingSize: 4 << 20} // 8-byte unit
	tests := []struct {
		name  string
		local Params
		setup func(e *Endpoint)
		size  int
		want  error
	}{
		{"grow", p, nil, 64 << 10, nil},
		{"shrink to the minimum", p, nil, MinRingSize, nil},
		{"grow to the last size of a byte unit", p, nil, 512 << 10, nil},
		{"same size", p, nil, 16 << 10, ErrBadParams},
		{"not a power of two", p, nil, 48 << 10, ErrBadParams},
		{"below the minimum", p, nil, MinRingSize / 2, ErrBadParams},
		{"negative", p, nil, -1, ErrBadParams},
		{"another ring unit", p, nil, 1 << 20, ErrBadParams},
		// Above 512 KiB every size has a unit of its own.
		{"above 512 KiB, larger", big, nil, 2 << 20, ErrBadParams},
		{"above 512 KiB, smaller", big, nil, 512 << 10, ErrBadParams},
		// A unit fixed at setup is every ring's up to the size that fixed it.
		{"fixed unit: to the size that fixed it", fixed, nil, 4 << 20, nil},
		{"fixed unit: past 512 KiB", fixed, nil, 1 << 20, nil},
		{"fixed unit: within 512 KiB", fixed, nil, 64 << 10, nil},
		{"fixed unit: above the size that fixed it", fixed, nil, 8 << 20, ErrBadParams},
		{"while one is asked for", p, func(e *Endpoint) { require.NoError(t, e.Resize(32<<10)) }, 64 << 10, ErrResizeBusy},
		{"while one is announced", p, func(e *Endpoint) {
			require.NoError(t, e.Resize(32<<10))
			m, ok := e.NextControl()
			require.True(t, ok)
			require.Equal(t, KindResize, m.Kind)
		}, 64 << 10, ErrResizeBusy},
		{"after the peer's FIN", p, func(e *Endpoint) {
			_, err := e.OnArrival(0, imm(KindFIN, 0, 0))
			require.NoError(t, err)
		}, 64 << 10, ErrResizeBusy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewEndpoint(tt.local, p)
			require.NoError(t, err)
			if tt.setup != nil {
				tt.setup(e)
			}
			err = e.Resize(tt.size)
			if tt.want == nil {
				require.NoError(t, err)
				require.True(t, e.Resizing())
				return
			}
			require.ErrorIs(t, err, tt.want)
		})
	}
}

// TestResizeViolations: a peer's resize or switch that breaks the protocol fails the
// Endpoint with ErrBadResize (or ErrMalformed, for one that does not decode).
func TestResizeViolations(t *testing.T) {
	p := Params{RingSize: 16 << 10, RecvWQEs: 64}
	resize := func(log2 uint8) uint32 { return Imm{Kind: KindResize, RingLog2: log2}.pack() }
	tests := []struct {
		name string
		msgs [][2]uint32 // byte length, immediate
		want error
	}{
		{"switch nobody asked for", [][2]uint32{{0, imm(KindSwitch, 0, 0)}}, ErrBadResize},
		{"resize to the same size", [][2]uint32{{ResizeLen, resize(14)}}, ErrBadResize},
		{"resize below the minimum", [][2]uint32{{ResizeLen, resize(11)}}, ErrBadResize},
		{"resize to another ring unit", [][2]uint32{{ResizeLen, resize(20)}}, ErrBadResize},
		{"second resize before the switch", [][2]uint32{{ResizeLen, resize(15)}, {ResizeLen, resize(16)}}, ErrBadResize},
		{"resize without its payload", [][2]uint32{{0, resize(15)}}, ErrMalformed},
		{"resize above 1 GiB", [][2]uint32{{ResizeLen, resize(31)}}, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewEndpoint(p, p)
			require.NoError(t, err)
			for i, m := range tt.msgs {
				_, err = e.OnArrival(m[0], m[1])
				if i < len(tt.msgs)-1 {
					require.NoError(t, err)
				}
			}
			require.ErrorIs(t, err, tt.want)
			require.ErrorIs(t, e.Err(), tt.want, "sticky")
		})
	}
}

// resizePair is two Endpoints, a writer w and a receiver r, with a wire between them
// that delivers each message as soon as it is handed out.
type resizePair struct {
	t    *testing.T
	w, r *Endpoint
}

func newResizePair(t *testing.T, ring int) *resizePair {
	return newResizePairOf(t, Params{RingSize: ring, RecvWQEs: 64})
}

// newResizePairOf is newResizePair with the receiver's Params rp (the writer's ring is
// of the same size, its unit its own).
func newResizePairOf(t *testing.T, rp Params) *resizePair {
	wp := Params{RingSize: rp.RingSize, RecvWQEs: rp.RecvWQEs}
	w, err := NewEndpoint(wp, rp)
	require.NoError(t, err)
	r, err := NewEndpoint(rp, wp)
	require.NoError(t, err)
	return &resizePair{t: t, w: w, r: r}
}

// controls delivers what NextControl hands out on both sides until nothing is due,
// and returns the kinds that went from the receiver to the writer and back.
func (p *resizePair) controls() (fromR, fromW []Kind) {
	for progress := true; progress; {
		progress = false
		if m, ok := p.r.NextControl(); ok {
			_, err := p.w.OnArrival(uint32(m.Len), m.Imm)
			require.NoError(p.t, err)
			fromR, progress = append(fromR, m.Kind), true
		}
		if m, ok := p.w.NextControl(); ok {
			_, err := p.r.OnArrival(uint32(m.Len), m.Imm)
			require.NoError(p.t, err)
			fromW, progress = append(fromW, m.Kind), true
		}
	}
	return fromR, fromW
}

// write reserves n bytes at the writer and delivers them, returning the pieces of the
// receiver's ring they landed in.
func (p *resizePair) write(n int) []Piece {
	r, err := p.w.ReserveData(n)
	require.NoError(p.t, err)
	require.Equal(p.t, n, r.Bytes)
	var got []Piece
	for _, m := range r.Msgs[:r.Count] {
		a, err := p.r.OnArrival(uint32(m.Len), m.Imm)
		require.NoError(p.t, err)
		require.Equal(p.t, m.Piece, a.Piece, "where the writer wrote and where the receiver looks")
		got = append(got, a.Piece)
	}
	return got
}

// TestResizeGrowAndShrink walks one resize each way: the writer's bytes in flight
// before the switch stay in the old ring and are read there first; after the switch,
// writing starts at the new ring's beginning; a shrink leaves the writer with no room
// until enough is consumed.
func TestResizeGrowAndShrink(t *testing.T) {
	const small, large = 4 << 10, 16 << 10
	p := newResizePair(t, small)
	require.Equal(t, []Piece{{Off: 0, Len: 3000}}, p.write(3000))
	require.Equal(t, 3000, p.r.Held())

	// Grow: the resize goes out, the switch comes back at once.
	require.NoError(t, p.r.Resize(large))
	fromR, fromW := p.controls()
	require.Equal(t, []Kind{KindResize}, fromR)
	require.Equal(t, []Kind{KindSwitch}, fromW)
	require.Equal(t, large, p.r.RingSize())
	require.Equal(t, large, p.w.PeerRingSize())
	require.False(t, p.r.Resizing())
	require.True(t, p.r.OldRing(), "3000 bytes wait in the old ring")
	require.ErrorIs(t, p.r.Resize(small), ErrResizeBusy, "not while the old ring holds bytes")

	// The writer may now have a whole large ring outstanding, minus the 3000 bytes.
	require.Equal(t, large-3000, p.w.Writable())
	require.Equal(t, []Piece{{Off: 0, Len: 10000}}, p.write(10000), "the new ring from its start")
	first, second := p.r.Unread()
	require.Equal(t, Piece{Off: 0, Len: 3000}, first, "the old ring first")
	require.Zero(t, second.Len)
	require.NoError(t, p.r.Consume(3000))
	require.False(t, p.r.OldRing(), "drained: the engine frees it")
	require.Equal(t, 13000, p.r.Held(), "consumed, not yet returned")
	first, _ = p.r.Unread()
	require.Equal(t, Piece{Off: 0, Len: 10000}, first)
	require.NoError(t, p.r.Consume(4000))

	// Shrink with 6000 bytes buffered and 10000 outstanding: more than the new ring.
	require.NoError(t, p.r.Resize(small))
	p.controls()
	require.Equal(t, small, p.w.PeerRingSize())
	require.Zero(t, p.w.Writable(), "10000 bytes outstanding in a ring of 4096")
	require.NoError(t, p.r.Consume(6000)) // the rest, from the old ring
	require.False(t, p.r.OldRing())
	p.controls() // the credit update
	require.Equal(t, small, p.w.Writable())
	require.Equal(t, []Piece{{Off: 0, Len: small}}, p.write(small))
	require.Zero(t, p.w.Writable())
	require.NoError(t, p.r.Consume(100))
	require.NoError(t, p.r.Consume(small-100))
	p.controls()
	require.Equal(t, []Piece{{Off: 0, Len: 100}}, p.write(100), "the shrunk ring wraps at its own size")
}

// TestResizeFixedUnit: a receiver that fixed its credit unit at setup (8 bytes, the
// unit of 4 MiB) grows from 8 KiB past 512 KiB to 4 MiB, a writer that knows the unit
// follows every resize, and credit comes back in that unit at every size, small rings
// included. Without the unit fixed, the writer refuses the resize past 512 KiB.
func TestResizeFixedUnit(t *testing.T) {
	const unit = 8
	p := newResizePairOf(t, Params{RingSize: 8 << 10, RecvWQEs: 64, UnitRingSize: 4 << 20})
	require.Equal(t, []Piece{{Off: 0, Len: 3}}, p.write(3))
	require.NoError(t, p.r.Consume(3))
	_, ok := p.r.CreditNow()
	require.False(t, ok, "3 bytes are less than the 8-byte unit")
	require.Equal(t, []Piece{{Off: 3, Len: 5}}, p.write(5))
	require.NoError(t, p.r.Consume(5))
	require.Equal(t, 8<<10-unit, p.w.Writable(), "the last 8 bytes not returned yet")

	for _, size := range []int{32 << 10, 128 << 10, 512 << 10, 2 << 20, 4 << 20} {
		require.NoError(t, p.r.Resize(size), "resize to %d", size)
		fromR, fromW := p.controls()
		require.Equal(t, []Kind{KindResize}, fromR, "resize to %d", size)
		require.Equal(t, []Kind{KindSwitch}, fromW, "resize to %d", size)
		require.Equal(t, size, p.w.PeerRingSize())
		// Fill the new ring and read it all: the writer gets all of it back.
		for left := size - (p.r.Held()); left > 0; {
			n := min(left, 1<<20)
			p.write(n)
			require.NoError(t, p.r.Consume(n))
			left -= n
		}
		p.controls()
		require.Zero(t, p.r.Held()%unit, "credit returned in whole units")
	}
	require.ErrorIs(t, p.r.Resize(8<<20), ErrBadParams, "8 MiB has a unit of 16 bytes")

	// A writer that does not know the unit (the peer's Params name none) takes the
	// receiver's ring for 1-byte units and refuses a resize past 512 KiB.
	w, err := NewEndpoint(Params{RingSize: 8 << 10, RecvWQEs: 64}, Params{RingSize: 8 << 10, RecvWQEs: 64})
	require.NoError(t, err)
	_, err = w.OnArrival(ResizeLen, Imm{Kind: KindResize, RingLog2: 21}.pack())
	require.ErrorIs(t, err, ErrBadResize)
}

// TestResizeSwitchWaitsForCredit: a writer without data credit answers a resize only
// when credit comes, and writes nothing before its switch.
func TestResizeSwitchWaitsForCredit(t *testing.T) {
	p := Params{RingSize: 4 << 10, RecvWQEs: MinRecvWQEs}
	w, err := NewEndpoint(p, p)
	require.NoError(t, err)
	// Spend the data credit: MinRecvWQEs-ReservedCredits one-byte messages.
	for range MinRecvWQEs - ReservedCredits {
		r, err := w.ReserveData(1)
		require.NoError(t, err)
		require.Equal(t, 1, r.Count)
	}
	_, err = w.OnArrival(ResizeLen, Imm{Kind: KindResize, RingLog2: 13}.pack())
	require.NoError(t, err)
	_, ok := w.NextControl()
	require.False(t, ok, "the switch takes data credit, not the reserve")
	require.Zero(t, w.Writable())
	// Credit comes back: the switch goes first, then data into the new ring.
	_, err = w.OnArrival(0, imm(KindCredit, 2, 2))
	require.NoError(t, err)
	r, err := w.ReserveData(10)
	require.NoError(t, err)
	require.Zero(t, r.Count, "no data before the switch")
	m, ok := w.NextControl()
	require.True(t, ok)
	require.Equal(t, KindSwitch, m.Kind)
	require.Equal(t, 8<<10, w.PeerRingSize())
	r, err = w.ReserveData(10)
	require.NoError(t, err)
	require.Equal(t, Piece{Off: 0, Len: 10}, r.Msgs[0].Piece)
}

// TestResizeImmCarriesWQECredit: the resize message returns WQE credit like any other,
// and leaves the owed ring credit to the next message.
func TestResizeImmCarriesWQECredit(t *testing.T) {
	p := newResizePair(t, 4<<10)
	p.write(2500)
	require.NoError(t, p.r.Consume(2500)) // past half the ring: an update is due too
	require.NoError(t, p.r.Resize(8<<10))
	m, ok := p.r.NextControl()
	require.True(t, ok)
	require.Equal(t, ResizeLen, m.Len)
	got, err := DecodeImm(m.Imm, uint32(m.Len))
	require.NoError(t, err)
	require.Equal(t, Imm{Kind: KindResize, WQECredits: 1, RingLog2: 13}, got)
	require.Equal(t, uint64(0), p.r.returned, "ring credit still owed")
	m, ok = p.r.NextControl()
	require.True(t, ok, "the owed ring credit goes in an update of its own")
	got, err = DecodeImm(m.Imm, 0)
	require.NoError(t, err)
	require.Equal(t, Imm{Kind: KindCredit, RingCredits: 2500}, got)
}
