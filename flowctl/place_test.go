package flowctl

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func placeImm(op PlaceOp, wqe, units uint32) uint32 {
	return Imm{Kind: KindPlace, WQECredits: wqe, Op: op, PlaceUnits: units}.pack()
}

// TestPlaceImm: the placement immediates as drawn in imm.go, and every operation back
// from its byte length.
func TestPlaceImm(t *testing.T) {
	tests := []struct {
		m       Imm
		byteLen uint32
		want    uint32
	}{
		{Imm{Kind: KindPlace, Op: PlaceAdvert, PlaceUnits: 1}, AdvertLen, 0xe000_0001},
		{Imm{Kind: KindPlace, Op: PlaceAdvert, WQECredits: 3, PlaceUnits: placeUnitsMask}, AdvertLen, 0xe033_ffff},
		{Imm{Kind: KindPlace, Op: PlacePlaced, WQECredits: 1}, 1, 0xe014_0000},
		{Imm{Kind: KindPlace, Op: PlaceDecline}, 0, 0xe008_0000},
		{Imm{Kind: KindPlace, Op: PlaceCancel, WQECredits: MaxImmWQECredits}, 0, 0xfffc_0000},
	}
	for _, tt := range tests {
		got, err := tt.m.Encode()
		if err != nil || got != tt.want {
			t.Errorf("%+v.Encode() = %#08x, %v, want %#08x", tt.m, got, err, tt.want)
		}
		back, err := DecodeImm(tt.want, tt.byteLen)
		if err != nil || back != tt.m {
			t.Errorf("DecodeImm(%#08x, %d) = %+v, %v, want %+v", tt.want, tt.byteLen, back, err, tt.m)
		}
	}
	for _, op := range []PlaceOp{PlaceAdvert, PlacePlaced, PlaceDecline, PlaceCancel} {
		for _, wqe := range []uint32{0, 1, 255, MaxImmWQECredits} {
			for _, units := range []uint32{0, 1, 1 << 17, placeUnitsMask} {
				m := Imm{Kind: KindPlace, WQECredits: wqe, Op: op, PlaceUnits: units}
				imm, err := m.Encode()
				if (op == PlaceAdvert) != (units != 0) {
					require.ErrorIs(t, err, ErrMalformed, "%+v.Encode()", m)
					continue
				}
				require.NoError(t, err, "%+v.Encode()", m)
				byteLen := map[PlaceOp]uint32{PlaceAdvert: AdvertLen, PlacePlaced: 1 << 20}[op]
				got, err := DecodeImm(imm, byteLen)
				if err != nil || got != m {
					t.Errorf("DecodeImm(%+v.Encode() = %#08x, %d) = %+v, %v, want it back", m, imm, byteLen, got, err)
				}
			}
		}
	}
}

func TestPlaceImmRejects(t *testing.T) {
	encode := []Imm{
		{Kind: KindPlace, Op: PlaceAdvert},                                    // advertises nothing
		{Kind: KindPlace, Op: PlaceAdvert, PlaceUnits: placeUnitsMask + 1},    // too long for the field
		{Kind: KindPlace, Op: PlacePlaced, PlaceUnits: 1},                     // a length in placed bytes
		{Kind: KindPlace, Op: PlaceDecline, PlaceUnits: 1},                    // a length in a decline
		{Kind: KindPlace, Op: PlaceCancel, PlaceUnits: 1},                     // a length in a cancel
		{Kind: KindPlace, Op: PlaceCancel + 1},                                // unknown operation
		{Kind: KindPlace, Op: PlaceDecline, RingCredits: 1},                   // ring credit in a placement
		{Kind: KindPlace, Op: PlaceAdvert, PlaceUnits: 1, RingLog2: 12},       // a ring size in a placement
		{Kind: KindPlace, Op: PlaceDecline, WQECredits: MaxImmWQECredits + 1}, // WQE credit too large
		{Kind: KindData, Op: PlacePlaced},                                     // an operation in data
		{Kind: KindCredit, PlaceUnits: 1},                                     // a length in a credit update
	}
	for _, m := range encode {
		if imm, err := m.Encode(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v.Encode() = %#08x, %v, want ErrMalformed", m, imm, err)
		}
	}
	decode := []struct {
		imm, byteLen uint32
	}{
		{placeImm(PlaceAdvert, 0, 1), 0},             // advertisement without its payload
		{placeImm(PlaceAdvert, 0, 1), AdvertLen - 1}, // with a short payload
		{placeImm(PlaceAdvert, 0, 1), AdvertLen + 1}, // with a long one
		{placeImm(PlaceAdvert, 0, 0), AdvertLen},     // advertising nothing
		{placeImm(PlacePlaced, 0, 0), 0},             // placing nothing
		{placeImm(PlacePlaced, 0, 0) | 1, 10},        // placed bytes naming a length
		{placeImm(PlaceDecline, 0, 0), 1},            // a decline with bytes
		{placeImm(PlaceDecline, 0, 0) | 1, 0},        // a decline naming a length
		{placeImm(PlaceCancel, 0, 0), 4096},          // a cancel with bytes
		{placeImm(PlaceCancel, 0, 0) | 0x3ffff, 0},   // a cancel naming a length
	}
	for _, tt := range decode {
		if m, err := DecodeImm(tt.imm, tt.byteLen); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeImm(%#08x, %d) = %+v, %v, want ErrMalformed", tt.imm, tt.byteLen, m, err)
		}
	}
}

func TestPlaceOpString(t *testing.T) {
	tests := []struct {
		op   PlaceOp
		want string
	}{
		{PlaceAdvert, "advert"}, {PlacePlaced, "placed"}, {PlaceDecline, "decline"}, {PlaceCancel, "cancel"}, {4, "PlaceOp(4)"},
	}
	for _, tt := range tests {
		if got := tt.op.String(); got != tt.want {
			t.Errorf("PlaceOp(%d).String() = %q, want %q", uint8(tt.op), got, tt.want)
		}
	}
}

var placeParams = Params{RingSize: 16 << 10, RecvWQEs: 16}

// placePair is a reader r and a writer w with a wire each way that holds messages until
// they are delivered, in order.
type placePair struct {
	t          *testing.T
	w, r       *Endpoint
	toW, toR   []Msg
	arrivedAtR []string // what reached r, as kind or placement op
}

func newPlacePair(t *testing.T) *placePair {
	t.Helper()
	return &placePair{t: t, w: newTestEndpoint(t, placeParams, placeParams), r: newTestEndpoint(t, placeParams, placeParams)}
}

// sendR and sendW post what NextControl hands out on r's or w's side.
func (p *placePair) sendR() {
	for m, ok := p.r.NextControl(); ok; m, ok = p.r.NextControl() {
		p.toW = append(p.toW, m)
	}
}

func (p *placePair) sendW() {
	for m, ok := p.w.NextControl(); ok; m, ok = p.w.NextControl() {
		p.toR = append(p.toR, m)
	}
}

// write posts n bytes of ring data from w.
func (p *placePair) write(n int) {
	res, err := p.w.ReserveData(n)
	require.NoError(p.t, err)
	require.Equal(p.t, n, res.Bytes)
	p.toR = append(p.toR, res.Msgs[:res.Count]...)
}

// place posts n bytes placed by w.
func (p *placePair) place(n int) {
	m, err := p.w.ReservePlace(n)
	require.NoError(p.t, err)
	p.toR = append(p.toR, m)
}

// deliverW delivers what is on its way to w; an advertisement's cursor is the one r
// named when it was handed out, as the engine would have put it in the payload.
func (p *placePair) deliverW(cursor uint64) {
	for _, m := range p.toW {
		a, err := p.w.OnArrival(uint32(m.Len), m.Imm)
		require.NoError(p.t, err)
		if a.Kind == KindPlace && a.Op == PlaceAdvert {
			require.NoError(p.t, p.w.PeerAdvert(uint32(cursor)))
		}
	}
	p.toW = p.toW[:0]
}

// deliverR delivers what is on its way to r, checking that data makes r's
// advertisement stale and noting what arrived.
func (p *placePair) deliverR() {
	for _, m := range p.toR {
		pending := p.r.AdvertPending()
		a, err := p.r.OnArrival(uint32(m.Len), m.Imm)
		require.NoError(p.t, err)
		what := a.Kind.String()
		if a.Kind == KindPlace {
			what = a.Op.String()
			if a.Op == PlacePlaced {
				what = fmt.Sprintf("placed %d", a.Len)
			}
		}
		if a.Kind == KindData && pending {
			require.True(p.t, p.r.AdvertPending(), "data does not answer an advertisement")
			require.False(p.t, p.r.AdvertUsable(), "the peer wrote the ring past the advertisement: the buffer is the application's again")
		}
		p.arrivedAtR = append(p.arrivedAtR, what)
	}
	p.toR = p.toR[:0]
}

// advertise has r advertise n bytes and hands the advertisement out; it returns the
// cursor the engine would put in its payload.
func (p *placePair) advertise(n int) uint64 {
	l, err := p.r.Advertise(n)
	require.NoError(p.t, err)
	require.True(p.t, p.r.AdvertPending())
	require.True(p.t, p.r.AdvertUsable())
	p.sendR()
	got, cursor := p.r.Advert()
	require.Equal(p.t, l, got)
	return cursor
}

// TestPlace walks direct placement: an advertisement, the bytes placed into it, and
// the state on both sides after.
func TestPlace(t *testing.T) {
	p := newPlacePair(t)
	p.write(100)
	p.deliverR()
	require.NoError(t, p.r.Consume(100))
	owed := p.r.reaped - p.r.wqeReturned

	// The advertisement: to the mailbox, with the WQE credit owed; its ring credit waits.
	require.Zero(t, p.w.Placeable())
	cursor := p.advertise(3*PlaceUnit + 100)
	require.Len(t, p.toW, 1)
	m := p.toW[0]
	require.Equal(t, KindPlace, m.Kind)
	require.Equal(t, AdvertLen, m.Len)
	got, err := DecodeImm(m.Imm, uint32(m.Len))
	require.NoError(t, err)
	require.Equal(t, Imm{Kind: KindPlace, WQECredits: uint32(owed), Op: PlaceAdvert, PlaceUnits: 3}, got)
	require.Equal(t, uint64(100), cursor, "the cursor is what arrived in the ring")
	require.Zero(t, p.r.returned, "the 100 bytes' ring credit still owed")

	// The writer: placeable at its cursor, once PeerAdvert has it.
	a, err := p.w.OnArrival(uint32(m.Len), m.Imm)
	require.NoError(t, err)
	require.Equal(t, Arrival{Kind: KindPlace, Op: PlaceAdvert, Credited: owed != 0}, a)
	require.Zero(t, p.w.Placeable(), "not before PeerAdvert")
	require.NoError(t, p.w.PeerAdvert(uint32(cursor)))
	p.toW = p.toW[:0]
	require.Equal(t, 3*PlaceUnit, p.w.Placeable())
	writable, credit, prod := p.w.Writable(), p.w.credit(), p.w.prod

	_, err = p.w.ReservePlace(0)
	require.ErrorIs(t, err, ErrBadLength)
	_, err = p.w.ReservePlace(3*PlaceUnit + 1)
	require.ErrorIs(t, err, ErrBadLength)
	pm, err := p.w.ReservePlace(5000)
	require.NoError(t, err)
	require.Equal(t, Msg{Piece: Piece{Len: 5000}, Imm: placeImm(PlacePlaced, 1, 0), Kind: KindPlace}, pm, "returning the advertisement's WQE")
	require.Equal(t, prod, p.w.prod, "placed bytes move no cursor")
	require.Equal(t, writable, p.w.Writable(), "and take no ring credit")
	require.Equal(t, credit-1, p.w.credit(), "but a WQE")
	require.Zero(t, p.w.Placeable(), "answered")
	_, err = p.w.ReservePlace(1)
	require.ErrorIs(t, err, ErrBadLength, "a second placement into one advertisement")
	p.sendW()
	require.Empty(t, p.toR, "nothing more to answer")

	// The reader: the bytes are the application's, past the ring.
	p.toR = append(p.toR, pm)
	p.deliverR()
	require.Equal(t, []string{"data", "placed 5000"}, p.arrivedAtR)
	require.False(t, p.r.AdvertPending())
	require.False(t, p.r.AdvertUsable())
	l, c := p.r.Advert()
	require.Zero(t, l)
	require.Zero(t, c)
	require.Zero(t, p.r.Buffered())
	require.Equal(t, uint64(100), p.r.arrived)
	require.Equal(t, uint64(1), p.w.Stats().PlacedSent)
	require.Equal(t, uint64(1), p.r.Stats().PlacedReceived)

	// The ring goes on where it was; the next advertisement continues it.
	p.write(10)
	p.deliverR()
	require.NoError(t, p.r.Consume(10))
	require.Equal(t, uint64(110), p.advertise(PlaceUnit))
}

// TestPlaceAnswers: every advertisement gets exactly one answer: the bytes placed, a
// decline, or the FIN, whatever the writer does and whenever.
func TestPlaceAnswers(t *testing.T) {
	tests := []struct {
		name string
		// run acts with r's advertisement handed out and on its way to w; deliverW
		// delivers it, with the cursor r named.
		run  func(p *placePair, deliverW func())
		want []string // what reaches r after the advertisement, in order
	}{
		{"placed", func(p *placePair, deliverW func()) {
			deliverW()
			p.place(10)
		}, []string{"placed 10"}},
		{"placed, all of it", func(p *placePair, deliverW func()) {
			deliverW()
			p.place(PlaceUnit)
		}, []string{"placed 4096"}},
		{"ring data before the advertisement arrives", func(p *placePair, deliverW func()) {
			p.write(10)
			deliverW()
			require.Zero(p.t, p.w.Placeable(), "the advertisement's cursor is behind ours")
		}, []string{"data", "decline"}},
		{"ring data after it arrives", func(p *placePair, deliverW func()) {
			deliverW()
			require.Equal(p.t, PlaceUnit, p.w.Placeable())
			p.write(10)
			require.Zero(p.t, p.w.Placeable())
		}, []string{"data", "decline"}},
		{"declined", func(p *placePair, deliverW func()) {
			deliverW()
			p.w.declinePlace()
			require.Zero(p.t, p.w.Placeable())
		}, []string{"decline"}},
		{"declined twice", func(p *placePair, deliverW func()) {
			deliverW()
			p.w.declinePlace()
			p.sendW()
			p.w.declinePlace()
		}, []string{"decline"}},
		{"canceled", func(p *placePair, deliverW func()) {
			p.r.CancelAdvert()
			p.r.CancelAdvert()
			require.True(p.t, p.r.AdvertUsable(), "the buffer is the writer's until the answer")
			p.sendR()
			require.Len(p.t, p.toW, 2, "the advertisement and one cancel")
			deliverW()
		}, []string{"decline"}},
		{"canceled while the writer declines", func(p *placePair, deliverW func()) {
			deliverW()
			p.w.declinePlace()
			p.r.CancelAdvert()
			p.sendR()
			deliverW()
		}, []string{"decline"}},
		{"canceled after the placement", func(p *placePair, deliverW func()) {
			deliverW()
			p.place(7)
			p.r.CancelAdvert()
			p.sendR()
			deliverW()
		}, []string{"placed 7"}},
		{"canceled after the decline", func(p *placePair, deliverW func()) {
			deliverW()
			p.w.declinePlace()
			p.sendW()
			p.r.CancelAdvert()
			p.sendR()
			deliverW()
		}, []string{"decline"}},
		{"FIN", func(p *placePair, deliverW func()) {
			deliverW()
			p.w.CloseWrite()
			require.Zero(p.t, p.w.Placeable())
		}, []string{"fin"}},
		{"FIN with a decline due", func(p *placePair, deliverW func()) {
			deliverW()
			p.w.declinePlace()
			p.w.CloseWrite()
		}, []string{"fin"}},
		{"FIN before the advertisement arrives", func(p *placePair, deliverW func()) {
			p.w.CloseWrite()
			p.sendW()
			deliverW()
			require.Zero(p.t, p.w.Placeable())
		}, []string{"fin"}},
		{"FIN after ring data", func(p *placePair, deliverW func()) {
			deliverW()
			p.write(10)
			p.w.CloseWrite()
		}, []string{"data", "fin"}},
		{"decline, then FIN", func(p *placePair, deliverW func()) {
			deliverW()
			p.w.declinePlace()
			p.sendW()
			p.w.CloseWrite()
		}, []string{"decline", "fin"}},
		{"placed, then ring data and FIN", func(p *placePair, deliverW func()) {
			deliverW()
			p.place(10)
			p.write(10)
			p.w.CloseWrite()
		}, []string{"placed 10", "data", "fin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlacePair(t)
			cursor := p.advertise(PlaceUnit)
			tt.run(p, func() { p.deliverW(cursor) })
			p.sendW()
			p.deliverR()
			require.Equal(t, tt.want, p.arrivedAtR)
			require.False(t, p.r.AdvertPending(), "answered")
			require.False(t, p.r.AdvertUsable())
			// Nothing else is due or held on either side: no second answer, no cancel.
			p.sendR()
			p.deliverW(cursor)
			p.sendW()
			require.Empty(t, p.toR, "a second answer")
			require.Zero(t, p.w.Placeable())
			require.Zero(t, p.w.peerAdvert, "the writer still holds the advertisement")
			require.NoError(t, p.r.Err())
			require.NoError(t, p.w.Err())
			if !p.r.PeerClosed() {
				require.NoError(t, p.r.Consume(p.r.Buffered()))
				_, err := p.r.Advertise(PlaceUnit)
				require.NoError(t, err, "a new advertisement after the answer")
			}
		})
	}
}

// TestAdvertise covers the lengths and states in which Advertise refuses.
func TestAdvertise(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, e *Endpoint)
		n     int
		want  int
		err   error
	}{
		{"one unit", nil, PlaceUnit, PlaceUnit, nil},
		{"rounded down", nil, 3*PlaceUnit - 1, 2 * PlaceUnit, nil},
		{"the most", nil, MaxPlaceLen, MaxPlaceLen, nil},
		{"more than the most", nil, MaxPlaceLen + 5*PlaceUnit + 1, MaxPlaceLen, nil},
		{"below a unit", nil, PlaceUnit - 1, 0, ErrBadLength},
		{"zero", nil, 0, 0, ErrBadLength},
		{"negative", nil, -PlaceUnit, 0, ErrBadLength},
		{"with bytes buffered", func(t *testing.T, e *Endpoint) {
			deliver(t, e, Msg{Piece: Piece{Len: 1}, Imm: imm(KindData, 0, 0)})
		}, PlaceUnit, 0, ErrPlaceBusy},
		{"with the bytes consumed", func(t *testing.T, e *Endpoint) {
			deliver(t, e, Msg{Piece: Piece{Len: 1}, Imm: imm(KindData, 0, 0)})
			require.NoError(t, e.Consume(1))
		}, PlaceUnit, PlaceUnit, nil},
		{"while one is asked for", func(t *testing.T, e *Endpoint) {
			_, err := e.Advertise(PlaceUnit)
			require.NoError(t, err)
		}, PlaceUnit, 0, ErrPlaceBusy},
		{"while one is unanswered", func(t *testing.T, e *Endpoint) {
			_, err := e.Advertise(PlaceUnit)
			require.NoError(t, err)
			_, ok := e.NextControl()
			require.True(t, ok)
		}, PlaceUnit, 0, ErrPlaceBusy},
		{"while a stale one is unanswered", func(t *testing.T, e *Endpoint) {
			_, err := e.Advertise(PlaceUnit)
			require.NoError(t, err)
			_, ok := e.NextControl()
			require.True(t, ok)
			deliver(t, e, Msg{Piece: Piece{Len: 1}, Imm: imm(KindData, 0, 0)})
			require.NoError(t, e.Consume(1))
		}, PlaceUnit, 0, ErrPlaceBusy},
		{"after the answer", func(t *testing.T, e *Endpoint) {
			_, err := e.Advertise(PlaceUnit)
			require.NoError(t, err)
			_, ok := e.NextControl()
			require.True(t, ok)
			deliver(t, e, Msg{Imm: placeImm(PlaceDecline, 1, 0), Kind: KindPlace})
		}, PlaceUnit, PlaceUnit, nil},
		{"after the peer's FIN", func(t *testing.T, e *Endpoint) {
			deliver(t, e, Msg{Imm: imm(KindFIN, 0, 0)})
		}, PlaceUnit, 0, ErrPlaceBusy},
		{"after a violation", func(t *testing.T, e *Endpoint) {
			_, err := e.OnArrival(0, 0)
			require.ErrorIs(t, err, ErrMalformed)
		}, PlaceUnit, 0, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEndpoint(t, placeParams, placeParams)
			if tt.setup != nil {
				tt.setup(t, e)
			}
			pending := e.AdvertPending()
			got, err := e.Advertise(tt.n)
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err)
				require.Zero(t, got)
				require.Equal(t, pending, e.AdvertPending(), "a refused Advertise changes nothing")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got, "Advertise(%d)", tt.n)
			m, ok := e.NextControl()
			require.True(t, ok)
			im, err := DecodeImm(m.Imm, uint32(m.Len))
			require.NoError(t, err)
			require.Equal(t, PlaceAdvert, im.Op)
			require.Equal(t, uint32(tt.want/PlaceUnit), im.PlaceUnits)
			l, _ := e.Advert()
			require.Equal(t, tt.want, l)
		})
	}
}

// TestAdvertWithdrawn: an advertisement asked for and not handed out is dropped by a
// cancel, by data and by the FIN, and nothing goes out for it.
func TestAdvertWithdrawn(t *testing.T) {
	tests := []struct {
		name     string
		withdraw func(t *testing.T, e *Endpoint)
		usable   bool // the Endpoint still counts on the buffer
	}{
		{"nothing", func(t *testing.T, e *Endpoint) {}, true},
		{"canceled", func(t *testing.T, e *Endpoint) { e.CancelAdvert() }, false},
		{"data arrives", func(t *testing.T, e *Endpoint) {
			deliver(t, e, Msg{Piece: Piece{Len: 1}, Imm: imm(KindData, 0, 0)})
		}, false},
		{"the FIN arrives", func(t *testing.T, e *Endpoint) {
			deliver(t, e, Msg{Imm: imm(KindFIN, 0, 0)})
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// No data credit: the advertisement waits.
			e := newTestEndpoint(t, placeParams, minParams)
			for range MinRecvWQEs - ReservedCredits {
				r, err := e.ReserveData(1)
				require.NoError(t, err)
				require.Equal(t, 1, r.Count)
			}
			_, err := e.Advertise(PlaceUnit)
			require.NoError(t, err)
			_, ok := e.NextControl()
			require.False(t, ok, "the advertisement spends data credit, not the reserve")
			tt.withdraw(t, e)
			require.Equal(t, tt.usable, e.AdvertPending())
			require.Equal(t, tt.usable, e.AdvertUsable())
			// Credit comes back: only an advertisement still asked for goes out.
			deliver(t, e, Msg{Imm: imm(KindCredit, 2, 0)})
			m, ok := e.NextControl()
			if !tt.usable {
				require.False(t, ok, "handed out %+v", m)
				return
			}
			require.True(t, ok)
			require.Equal(t, AdvertLen, m.Len)
		})
	}
}

// TestPlaceCredit: placement messages spend data credit, never the reserve, on both
// sides, and carry WQE credit but no ring credit; only the FIN, which answers an
// advertisement too, may take the reserve.
func TestPlaceCredit(t *testing.T) {
	t.Run("writer", func(t *testing.T) {
		w := newTestEndpoint(t, placeParams, minParams)
		for range MinRecvWQEs - ReservedCredits {
			r, err := w.ReserveData(1)
			require.NoError(t, err)
			require.Equal(t, 1, r.Count)
		}
		deliver(t, w, Msg{Piece: Piece{Len: 10}, Imm: imm(KindData, 0, 0)})
		require.NoError(t, w.Consume(10)) // ring credit owed to the peer
		_, err := w.OnArrival(AdvertLen, placeImm(PlaceAdvert, 0, 1))
		require.NoError(t, err)
		require.NoError(t, w.PeerAdvert(MinRecvWQEs-ReservedCredits))
		require.Zero(t, w.Placeable(), "placing takes data credit")
		_, err = w.ReservePlace(1)
		require.ErrorIs(t, err, ErrBadLength)

		deliver(t, w, Msg{Imm: imm(KindCredit, 1, 0)})
		require.Equal(t, PlaceUnit, w.Placeable())
		m, err := w.ReservePlace(1)
		require.NoError(t, err)
		got, err := DecodeImm(m.Imm, uint32(m.Len))
		require.NoError(t, err)
		require.Equal(t, Imm{Kind: KindPlace, WQECredits: 3, Op: PlacePlaced}, got, "WQE credit, no ring credit")
		require.Equal(t, uint64(ReservedCredits), w.credit())
		require.Zero(t, w.returned, "the ring credit waits")

		_, err = w.OnArrival(AdvertLen, placeImm(PlaceAdvert, 0, 1))
		require.NoError(t, err)
		require.NoError(t, w.PeerAdvert(MinRecvWQEs-ReservedCredits))
		w.declinePlace()
		_, ok := w.NextControl()
		require.False(t, ok, "declining takes data credit")
		deliver(t, w, Msg{Imm: imm(KindCredit, 1, 0)})
		m, ok = w.NextControl()
		require.True(t, ok)
		got, err = DecodeImm(m.Imm, uint32(m.Len))
		require.NoError(t, err)
		require.Equal(t, Imm{Kind: KindPlace, WQECredits: 2, Op: PlaceDecline}, got)
		require.Zero(t, w.returned)

		// With only the reserve left, the FIN answers a third advertisement.
		_, err = w.OnArrival(AdvertLen, placeImm(PlaceAdvert, 0, 1))
		require.NoError(t, err)
		require.NoError(t, w.PeerAdvert(MinRecvWQEs-ReservedCredits))
		w.declinePlace()
		w.CloseWrite()
		m, ok = w.NextControl()
		require.True(t, ok)
		require.Equal(t, KindFIN, m.Kind)
		got, err = DecodeImm(m.Imm, uint32(m.Len))
		require.NoError(t, err)
		require.Equal(t, uint32(10), got.RingCredits, "the ring credit the placement messages left")
		_, ok = w.NextControl()
		require.False(t, ok, "no decline after the FIN")
	})
	t.Run("reader", func(t *testing.T) {
		r := newTestEndpoint(t, placeParams, minParams)
		for range MinRecvWQEs - ReservedCredits - 1 {
			_, err := r.ReserveData(1)
			require.NoError(t, err)
		}
		_, err := r.Advertise(PlaceUnit)
		require.NoError(t, err)
		m, ok := r.NextControl()
		require.True(t, ok, "the last data credit")
		require.Equal(t, AdvertLen, m.Len)
		r.CancelAdvert()
		_, ok = r.NextControl()
		require.False(t, ok, "canceling takes data credit")
		require.True(t, r.AdvertUsable())
		deliver(t, r, Msg{Imm: imm(KindCredit, 1, 0)})
		m, ok = r.NextControl()
		require.True(t, ok)
		got, err := DecodeImm(m.Imm, uint32(m.Len))
		require.NoError(t, err)
		require.Equal(t, Imm{Kind: KindPlace, WQECredits: 1, Op: PlaceCancel}, got)
	})
}

// TestPlaceWaitsForSwitch: a writer that owes the reader a switch places nothing until
// the switch is handed out; its cursor is the same after it.
func TestPlaceWaitsForSwitch(t *testing.T) {
	p := newPlacePair(t)
	p.write(10)
	p.deliverR()
	require.NoError(t, p.r.Consume(10))
	require.NoError(t, p.r.Resize(32<<10))
	cursor := p.advertise(PlaceUnit)
	require.Len(t, p.toW, 2, "the resize and the advertisement")
	w := p.w
	for _, m := range p.toW {
		a, err := w.OnArrival(uint32(m.Len), m.Imm)
		require.NoError(t, err)
		if a.Op == PlaceAdvert && a.Kind == KindPlace {
			require.NoError(t, w.PeerAdvert(uint32(cursor)))
		}
	}
	p.toW = p.toW[:0]
	require.True(t, w.switchDue)
	require.Zero(t, w.Placeable(), "the switch goes first")
	m, ok := w.NextControl()
	require.True(t, ok)
	require.Equal(t, KindSwitch, m.Kind)
	require.Equal(t, PlaceUnit, w.Placeable())
}

// TestPlaceViolations feeds an Endpoint placement messages a buggy or hostile peer might
// send, and cursors its engine might read out of the mailbox.
func TestPlaceViolations(t *testing.T) {
	type arrival struct{ byteLen, imm uint32 }
	var (
		advert  = arrival{AdvertLen, placeImm(PlaceAdvert, 0, 1)}
		placed  = func(n uint32) arrival { return arrival{n, placeImm(PlacePlaced, 0, 0)} }
		decline = arrival{0, placeImm(PlaceDecline, 0, 0)}
		cancel  = arrival{0, placeImm(PlaceCancel, 0, 0)}
		data    = arrival{10, imm(KindData, 0, 0)}
		fin     = arrival{0, imm(KindFIN, 0, 0)}
	)
	// advertise has the Endpoint advertise a buffer of units PlaceUnits and hand it out.
	advertise := func(units int) func(t *testing.T, e *Endpoint) {
		return func(t *testing.T, e *Endpoint) {
			_, err := e.Advertise(units * PlaceUnit)
			require.NoError(t, err)
			m, ok := e.NextControl()
			require.True(t, ok)
			require.Equal(t, AdvertLen, m.Len)
		}
	}
	// written has the Endpoint write 100 bytes, of which the peer returns the first 40.
	written := func(t *testing.T, e *Endpoint) {
		r, err := e.ReserveData(100)
		require.NoError(t, err)
		require.Equal(t, 100, r.Bytes)
		deliver(t, e, Msg{Imm: imm(KindCredit, 1, 40)})
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, e *Endpoint)
		msgs  []arrival // all but the last must be accepted
		lo32  []uint32  // cursors for PeerAdvert after each advertisement accepted, in order
		want  error     // nil: all accepted
	}{
		// The reader's side: answers.
		{"placed with no advertisement", nil, []arrival{placed(1)}, nil, ErrBadPlace},
		{"placed into one asked for, not handed out", func(t *testing.T, e *Endpoint) {
			_, err := e.Advertise(PlaceUnit)
			require.NoError(t, err)
		}, []arrival{placed(1)}, nil, ErrBadPlace},
		{"placed after data", advertise(1), []arrival{data, placed(1)}, nil, ErrBadPlace},
		{"placed past the buffer", advertise(2), []arrival{placed(2*PlaceUnit + 1)}, nil, ErrBadPlace},
		{"placed, all of the buffer", advertise(2), []arrival{placed(2 * PlaceUnit)}, nil, nil},
		{"placed twice", advertise(1), []arrival{placed(1), placed(1)}, nil, ErrBadPlace},
		{"decline with no advertisement", nil, []arrival{decline}, nil, ErrBadPlace},
		{"decline after data", advertise(1), []arrival{data, decline}, nil, nil},
		{"decline after the placement", advertise(1), []arrival{placed(1), decline}, nil, ErrBadPlace},
		{"decline twice", advertise(1), []arrival{decline, decline}, nil, ErrBadPlace},
		{"placed after the FIN", advertise(1), []arrival{fin, placed(1)}, nil, ErrAfterFIN},
		{"decline after the FIN", advertise(1), []arrival{fin, decline}, nil, ErrAfterFIN},
		{"decline after the FIN, no advertisement", nil, []arrival{fin, decline}, nil, ErrAfterFIN},
		// The writer's side: advertisements and cancels.
		{"advertisement", written, []arrival{advert}, []uint32{100}, nil},
		{"advertisement at the credit returned", written, []arrival{advert}, []uint32{40}, nil},
		{"advertisement past the cursor", written, []arrival{advert}, []uint32{101}, ErrBadPlace},
		{"advertisement before the credit returned", written, []arrival{advert}, []uint32{39}, ErrBadPlace},
		{"advertisement far past the cursor", written, []arrival{advert}, []uint32{1 << 31}, ErrBadPlace},
		{"advertisement, fresh", nil, []arrival{advert}, []uint32{0}, nil},
		{"advertisement past a fresh cursor", nil, []arrival{advert}, []uint32{1}, ErrBadPlace},
		{"second advertisement before the answer", nil, []arrival{advert, advert}, []uint32{0}, ErrBadPlace},
		{"second advertisement while the decline is due", nil, []arrival{advert, cancel, advert}, []uint32{0}, ErrBadPlace},
		{"second advertisement before PeerAdvert", nil, []arrival{advert, advert}, nil, ErrBadPlace},
		{"advertisement after the peer's FIN", nil, []arrival{fin, advert}, []uint32{0}, nil},
		{"cancel with no advertisement", nil, []arrival{cancel, cancel}, nil, nil},
		{"cancel after the peer's FIN", nil, []arrival{fin, advert, cancel}, []uint32{0}, nil},
		// Malformed.
		{"advertisement without its payload", nil, []arrival{{0, placeImm(PlaceAdvert, 0, 1)}}, nil, ErrMalformed},
		{"advertisement of nothing", nil, []arrival{{AdvertLen, placeImm(PlaceAdvert, 0, 0)}}, nil, ErrMalformed},
		{"placed, no bytes", advertise(1), []arrival{placed(0)}, nil, ErrMalformed},
		{"decline with bytes", advertise(1), []arrival{{1, placeImm(PlaceDecline, 0, 0)}}, nil, ErrMalformed},
		{"cancel naming a length", nil, []arrival{{0, placeImm(PlaceCancel, 0, 0) | 1}}, nil, ErrMalformed},
		// Credit.
		{"placed returning WQE credit never used", advertise(1), []arrival{{1, placeImm(PlacePlaced, 2, 0)}}, nil, ErrCreditOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEndpoint(t, placeParams, placeParams)
			if tt.setup != nil {
				tt.setup(t, e)
			}
			lo32 := tt.lo32
			var err error
			for i, m := range tt.msgs {
				var a Arrival
				a, err = e.OnArrival(m.byteLen, m.imm)
				if err == nil && a.Kind == KindPlace && a.Op == PlaceAdvert && len(lo32) > 0 {
					err = e.PeerAdvert(lo32[0])
					lo32 = lo32[1:]
				}
				if i < len(tt.msgs)-1 {
					require.NoError(t, err, "message %d", i)
				}
			}
			if tt.want == nil {
				require.NoError(t, err)
				require.NoError(t, e.Err())
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("last of %v = %v, want %v", tt.msgs, err, tt.want)
			}
			// The violation is sticky.
			require.ErrorIs(t, e.Err(), tt.want)
			_, err2 := e.OnArrival(0, imm(KindCredit, 0, 0))
			require.Equal(t, e.Err(), err2)
			_, err2 = e.Advertise(PlaceUnit)
			require.Equal(t, e.Err(), err2)
			_, err2 = e.ReservePlace(1)
			require.Equal(t, e.Err(), err2)
			require.Equal(t, e.Err(), e.PeerAdvert(0))
			require.Zero(t, e.Placeable())
			_, ok := e.NextControl()
			require.False(t, ok)
		})
	}
}

// TestPeerAdvertOutOfTurn: PeerAdvert with no advertisement just reported is the
// engine's mistake, not the peer's: it fails without failing the Endpoint.
func TestPeerAdvertOutOfTurn(t *testing.T) {
	e := newTestEndpoint(t, placeParams, placeParams)
	require.Error(t, e.PeerAdvert(0))
	_, err := e.OnArrival(AdvertLen, placeImm(PlaceAdvert, 0, 1))
	require.NoError(t, err)
	require.NoError(t, e.PeerAdvert(0))
	require.Error(t, e.PeerAdvert(0), "a second PeerAdvert for one advertisement")
	require.NoError(t, e.Err())
	require.Equal(t, PlaceUnit, e.Placeable())
}

// TestDeclinePlaceWithout: declinePlace with no advertisement declines nothing.
func TestDeclinePlaceWithout(t *testing.T) {
	e := newTestEndpoint(t, placeParams, placeParams)
	e.declinePlace()
	_, ok := e.NextControl()
	require.False(t, ok)
	_, err := e.OnArrival(AdvertLen, placeImm(PlaceAdvert, 0, 1))
	require.NoError(t, err)
	require.NoError(t, e.PeerAdvert(0))
	require.Equal(t, PlaceUnit, e.Placeable(), "the earlier declinePlace left no decline behind")
}
