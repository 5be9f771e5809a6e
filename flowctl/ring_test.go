package flowctl

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// minParams are the smallest resources a side may have.
var minParams = Params{RingSize: MinRingSize, RecvWQEs: MinRecvWQEs}

func newTestEndpoint(t *testing.T, local, peer Params) *Endpoint {
	t.Helper()
	e, err := NewEndpoint(local, peer)
	require.NoError(t, err)
	return e
}

// pieces lists the valid messages of r.
func pieces(r Reservation) []Piece {
	var ps []Piece
	for _, m := range r.Msgs[:r.Count] {
		ps = append(ps, m.Piece)
	}
	return ps
}

// TestReserveDataSplit covers where writes land in the peer's ring: wrap-around, exact
// fits at the ring's end and of the whole ring, zero-length writes, writes larger than
// the free space, and writes limited by WQE credit.
func TestReserveDataSplit(t *testing.T) {
	const ring = MinRingSize
	tests := []struct {
		name    string
		prod    uint64 // producer cursor before the write
		unread  uint64 // bytes written before prod and not yet returned
		credit  uint64 // WQE credit before the write
		n       int
		want    []Piece
		wantOff int // expected Off of the first piece
	}{
		{"from the start", 0, 0, 4, 100, []Piece{{0, 100}}, 0},
		{"zero-length", 100, 0, 4, 0, nil, 0},
		{"whole ring", 0, 0, 4, ring, []Piece{{0, ring}}, 0},
		{"more than the ring", 0, 0, 4, ring + 1, []Piece{{0, ring}}, 0},
		{"exactly to the end", ring - 96, 0, 4, 96, []Piece{{ring - 96, 96}}, 0},
		{"one past the end", ring - 96, 0, 4, 97, []Piece{{ring - 96, 96}, {0, 1}}, 0},
		{"whole ring from the middle", 3*ring + 10, 0, 4, ring, []Piece{{10, ring - 10}, {0, 10}}, 0},
		{"up to unread bytes", ring - 96, 10, 4, 5000, []Piece{{ring - 96, 96}, {0, ring - 106}}, 0},
		{"ring full", 5 * ring, ring, 4, 1, nil, 0},
		{"exactly the free space", 7*ring + 1, ring - 1, 4, 1, []Piece{{1, 1}}, 0},
		{"credit for one message stops at the end", ring - 96, 0, ReservedCredits + 1, 200, []Piece{{ring - 96, 96}}, 0},
		{"credit for one message, no wrap needed", 0, 0, ReservedCredits + 1, 200, []Piece{{0, 200}}, 0},
		{"only reserved credit left", 0, 0, ReservedCredits, 1, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEndpoint(t, minParams, minParams)
			e.prod, e.granted = tt.prod, tt.prod-tt.unread
			e.sent = e.wqeLimit - tt.credit
			writable := e.Writable()
			r, err := e.ReserveData(tt.n)
			require.NoError(t, err)
			if got := pieces(r); !equalPieces(got, tt.want) {
				t.Errorf("ring(%d) at %d with %d unread: ReserveData(%d) = %v, want %v", ring, tt.prod, tt.unread, tt.n, got, tt.want)
			}
			total := 0
			for _, p := range tt.want {
				total += p.Len
			}
			require.Equal(t, total, r.Bytes, "Bytes")
			require.Equal(t, tt.prod+uint64(total), e.prod, "producer cursor after the write")
			require.Equal(t, min(tt.n, writable), total, "Writable() before the write was %d", writable)
			for _, m := range r.Msgs[:r.Count] {
				imm, err := DecodeImm(m.Imm, uint32(m.Len))
				require.NoError(t, err)
				require.Equal(t, KindData, imm.Kind)
			}
		})
	}
}

func equalPieces(a, b []Piece) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestUnreadSplit covers how buffered bytes are named in the receiver's own ring.
func TestUnreadSplit(t *testing.T) {
	const ring = MinRingSize
	tests := []struct {
		consumed, arrived uint64
		first, second     Piece
	}{
		{0, 0, Piece{}, Piece{}},
		{0, 1, Piece{0, 1}, Piece{}},
		{0, ring, Piece{0, ring}, Piece{}},
		{ring - 1, ring, Piece{ring - 1, 1}, Piece{}},
		{ring - 1, ring + 1, Piece{ring - 1, 1}, Piece{0, 1}},
		{5*ring + 7, 6*ring + 7, Piece{7, ring - 7}, Piece{0, 7}},
		{6 * ring, 6 * ring, Piece{}, Piece{}},
	}
	for _, tt := range tests {
		e := newTestEndpoint(t, minParams, minParams)
		e.consumed, e.arrived, e.returned = tt.consumed, tt.arrived, tt.consumed
		first, second := e.Unread()
		if first != tt.first || second != tt.second {
			t.Errorf("ring(%d) with [%d, %d) buffered: Unread() = %v, %v, want %v, %v", ring, tt.consumed, tt.arrived, first, second, tt.first, tt.second)
		}
		if got := e.Buffered(); got != int(tt.arrived-tt.consumed) {
			t.Errorf("ring(%d) with [%d, %d) buffered: Buffered() = %d", ring, tt.consumed, tt.arrived, got)
		}
	}
}

// deliver passes messages to the Endpoint they were posted to, as the wire and the
// receiving engine would.
func deliver(t *testing.T, to *Endpoint, msgs ...Msg) {
	t.Helper()
	for _, m := range msgs {
		_, err := to.OnArrival(uint32(m.Len), m.Imm)
		require.NoError(t, err)
	}
}

// TestExactFitAndWrap fills a minimum-size ring exactly, twice over its end, and checks
// that the writer is held off until the reader's credit comes back, and not longer.
func TestExactFitAndWrap(t *testing.T) {
	// Enough WQEs that only ring space decides when updates go out.
	p := Params{RingSize: MinRingSize, RecvWQEs: 64}
	a := newTestEndpoint(t, p, p)
	b := newTestEndpoint(t, p, p)
	const ring = MinRingSize

	r, err := a.ReserveData(ring - 100)
	require.NoError(t, err)
	require.Equal(t, []Piece{{0, ring - 100}}, pieces(r))
	deliver(t, b, r.Msgs[:r.Count]...)
	require.NoError(t, b.Consume(ring-100))
	m, ok := b.NextControl() // more than half the ring consumed: an update is due
	require.True(t, ok, "update due after consuming %d of %d bytes", ring-100, ring)
	deliver(t, a, m)

	// The whole ring is free again; a full-ring write wraps at offset ring-100.
	require.Equal(t, ring, a.Writable())
	r, err = a.ReserveData(ring)
	require.NoError(t, err)
	require.Equal(t, []Piece{{ring - 100, 100}, {0, ring - 100}}, pieces(r))
	require.Zero(t, a.Writable(), "ring full")
	r2, err := a.ReserveData(1)
	require.NoError(t, err)
	require.Zero(t, r2.Count, "wrote into a full ring")

	deliver(t, b, r.Msgs[:r.Count]...)
	first, second := b.Unread()
	require.Equal(t, Piece{ring - 100, 100}, first)
	require.Equal(t, Piece{0, ring - 100}, second)

	// Consuming less than half the ring returns nothing yet; the writer stays blocked.
	require.NoError(t, b.Consume(ring/2-1))
	_, ok = b.NextControl()
	require.False(t, ok, "update sent before half the ring was consumed")
	require.NoError(t, b.Consume(1))
	m, ok = b.NextControl()
	require.True(t, ok, "no update after half the ring was consumed")
	deliver(t, a, m)
	require.Equal(t, ring/2, a.Writable())
}

// TestZeroLength: a zero-length write reserves nothing and sends nothing; Consume(0) is
// harmless; a data message of zero bytes from the peer is malformed.
func TestZeroLength(t *testing.T) {
	e := newTestEndpoint(t, minParams, minParams)
	before := *e
	r, err := e.ReserveData(0)
	require.NoError(t, err)
	require.Zero(t, r.Count)
	require.Zero(t, r.Bytes)
	require.NoError(t, e.Consume(0))
	require.Equal(t, before, *e, "a zero-length write or read changed the state")

	_, err = e.OnArrival(0, Imm{Kind: KindData}.pack())
	require.ErrorIs(t, err, ErrMalformed)
}

func TestBadLengths(t *testing.T) {
	e := newTestEndpoint(t, minParams, minParams)
	_, err := e.ReserveData(-1)
	require.ErrorIs(t, err, ErrBadLength)
	require.ErrorIs(t, e.Consume(-1), ErrBadLength)
	require.ErrorIs(t, e.Consume(1), ErrBadLength, "consumed more than buffered")
	require.NoError(t, e.Err(), "local misuse is not a protocol violation")
}

func TestParamsValidate(t *testing.T) {
	tests := []struct {
		p  Params
		ok bool
	}{
		{Params{RingSize: MinRingSize, RecvWQEs: MinRecvWQEs}, true},
		{Params{RingSize: MaxRingSize, RecvWQEs: MaxRecvWQEs}, true},
		{Params{RingSize: 128 << 10, RecvWQEs: 256}, true},
		{Params{RingSize: MinRingSize / 2, RecvWQEs: 64}, false},
		{Params{RingSize: MaxRingSize * 2, RecvWQEs: 64}, false},
		{Params{RingSize: MinRingSize + 1, RecvWQEs: 64}, false},
		{Params{RingSize: 3 * MinRingSize, RecvWQEs: 64}, false},
		{Params{RingSize: 0, RecvWQEs: 64}, false},
		{Params{RingSize: -MinRingSize, RecvWQEs: 64}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: MinRecvWQEs - 1}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: MaxRecvWQEs + 1}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: -1}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, UnitRingSize: 4 << 20}, true},
		{Params{RingSize: 1 << 20, RecvWQEs: 64, UnitRingSize: 1 << 20}, true},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, UnitRingSize: MaxRingSize}, true},
		{Params{RingSize: 1 << 20, RecvWQEs: 64, UnitRingSize: 512 << 10}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, UnitRingSize: 3 << 20}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, UnitRingSize: 2 * MaxRingSize}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, UnitRingSize: -1}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, GrowWQEsTo: 64}, true},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, GrowWQEsTo: MaxRecvWQEs}, true},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, GrowWQEsTo: 63}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, GrowWQEsTo: MaxRecvWQEs + 1}, false},
		{Params{RingSize: MinRingSize, RecvWQEs: 64, GrowWQEsTo: -1}, false},
	}
	for _, tt := range tests {
		err := tt.p.Validate()
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrBadParams)) {
			t.Errorf("%+v.Validate() = %v, want ok %v", tt.p, err, tt.ok)
		}
		_, err = NewEndpoint(tt.p, minParams)
		if (err == nil) != tt.ok {
			t.Errorf("NewEndpoint(%+v, min) = %v, want ok %v", tt.p, err, tt.ok)
		}
		_, err = NewEndpoint(minParams, tt.p)
		if (err == nil) != tt.ok {
			t.Errorf("NewEndpoint(min, %+v) = %v, want ok %v", tt.p, err, tt.ok)
		}
	}
}

func TestRingUnit(t *testing.T) {
	tests := []struct {
		ring, unit int
	}{
		{MinRingSize, 1}, {128 << 10, 1}, {512 << 10, 1}, {1 << 20, 2}, {64 << 20, 128}, {MaxRingSize, 2048},
	}
	for _, tt := range tests {
		if got := RingUnit(tt.ring); got != tt.unit {
			t.Errorf("RingUnit(%d) = %d, want %d", tt.ring, got, tt.unit)
		}
		if units := tt.ring / tt.unit; units > 1<<ringUnitsLog2 || units > MaxImmRingCredits {
			t.Errorf("ring(%d) has %d units, more than an immediate holds", tt.ring, units)
		}
	}
}

// TestRingUnitRounding: with 2-byte units, an odd consumed byte waits for its partner,
// and the sender can still use everything else.
func TestRingUnitRounding(t *testing.T) {
	big := Params{RingSize: 1 << 20, RecvWQEs: 64}
	a := newTestEndpoint(t, big, big)
	b := newTestEndpoint(t, big, big)
	r, err := a.ReserveData(1 << 20)
	require.NoError(t, err)
	require.Equal(t, 1<<20, r.Bytes)
	deliver(t, b, r.Msgs[:r.Count]...)
	require.NoError(t, b.Consume(1<<19+1))
	m, ok := b.NextControl()
	require.True(t, ok)
	imm, err := DecodeImm(m.Imm, 0)
	require.NoError(t, err)
	require.Equal(t, uint32(1<<18), imm.RingCredits, "units returned for %d bytes consumed", 1<<19+1)
	deliver(t, a, m)
	require.Equal(t, 1<<19, a.Writable())
	require.NoError(t, b.Consume(1))
	r, err = b.ReserveData(1) // data the other way carries the completed unit
	require.NoError(t, err)
	deliver(t, a, r.Msgs[0])
	require.Equal(t, 1<<19+2, a.Writable())
}

// TestMinimumSizesEndToEnd streams both ways between two Endpoints made by NewEndpoint
// with the smallest rings and WQE counts, through the model's checks.
func TestMinimumSizesEndToEnd(t *testing.T) {
	e := newTestEndpoint(t, minParams, minParams)
	require.Equal(t, newEndpoint(minParams, minParams), *e, "the model builds Endpoints as NewEndpoint does")
	cfg := &modelConfig{name: "minimum", ring: [2]int{MinRingSize, MinRingSize}, wqes: [2]int{MinRecvWQEs, MinRecvWQEs},
		total: [2]uint64{20 * MinRingSize, 15 * MinRingSize}, close: [2]bool{true, true}, keepalives: 2}
	rng := rand.New(rand.NewPCG(1, 2))
	_, err := runRandom(newModel(cfg), rng, 20000)
	require.NoError(t, err)
}

// TestRingHoldsTwoUnits: within the Params' limits every ring holds at least two
// credit units, the smallest ring with the unit of the largest (UnitRingSize)
// included. Returning only whole units then never holds back more than half a ring
// from a writer toward a reader that stopped, which the model checks
// (model.done); its random configurations keep to two units a ring too.
func TestRingHoldsTwoUnits(t *testing.T) {
	if units := MinRingSize / RingUnit(MaxRingSize); units < 2 {
		t.Errorf("a %d-byte ring with the unit of a %d-byte one holds %d units", MinRingSize, MaxRingSize, units)
	}
}
