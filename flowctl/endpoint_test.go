package flowctl

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func imm(kind Kind, wqe, ring uint32) uint32 {
	return Imm{Kind: kind, WQECredits: wqe, RingCredits: ring}.pack()
}

// TestOnArrivalViolations feeds an Endpoint what a buggy or hostile peer might send.
func TestOnArrivalViolations(t *testing.T) {
	const ring = MinRingSize
	p := Params{RingSize: ring, RecvWQEs: 8}
	type arrival struct{ byteLen, imm uint32 }
	reserve10 := func(t *testing.T, e *Endpoint) {
		r, err := e.ReserveData(10)
		require.NoError(t, err)
		require.Equal(t, 10, r.Bytes)
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, e *Endpoint) // local actions before the peer's messages
		msgs  []arrival                       // all but the last must be accepted
		want  error
	}{
		{"zero immediate", nil, []arrival{{0, 0}}, ErrMalformed},
		{"advertisement without its payload", nil, []arrival{{0, 7<<29 | 1}}, ErrMalformed},
		{"credit update with bytes", nil, []arrival{{3, imm(KindCredit, 0, 0)}}, ErrMalformed},
		{"data past a fresh ring", nil, []arrival{{ring + 1, imm(KindData, 0, 0)}}, ErrRingOverrun},
		{"data past the ring in two writes", nil, []arrival{{ring - 1, imm(KindData, 0, 0)}, {2, imm(KindData, 0, 0)}}, ErrRingOverrun},
		{"data past the credit returned", func(t *testing.T, e *Endpoint) {
			deliver(t, e, Msg{Piece: Piece{Len: ring}, Imm: imm(KindData, 0, 0)})
			require.NoError(t, e.Consume(ring))
			_, ok := e.NextControl() // returns the whole ring
			require.True(t, ok)
		}, []arrival{{ring, imm(KindData, 0, 0)}, {1, imm(KindData, 0, 0)}}, ErrRingOverrun},
		{"more messages than WQEs", nil, []arrival{
			{0, imm(KindCredit, 0, 0)}, {0, imm(KindCredit, 0, 0)}, {0, imm(KindCredit, 0, 0)}, {0, imm(KindCredit, 0, 0)},
			{0, imm(KindCredit, 0, 0)}, {0, imm(KindCredit, 0, 0)}, {0, imm(KindCredit, 0, 0)}, {0, imm(KindCredit, 0, 0)},
			{0, imm(KindKeepalive, 0, 0)},
		}, ErrWQEOverrun},
		{"WQE credit for nothing sent", nil, []arrival{{0, imm(KindCredit, 1, 0)}}, ErrCreditOverflow},
		{"WQE credit for more than sent", reserve10, []arrival{{0, imm(KindCredit, 1, 0)}, {0, imm(KindCredit, 1, 0)}}, ErrCreditOverflow},
		{"ring credit for nothing sent", nil, []arrival{{1, imm(KindData, 0, 1)}}, ErrCreditOverflow},
		{"ring credit for more than sent", reserve10, []arrival{{0, imm(KindFIN, 0, 11)}}, ErrCreditOverflow},
		{"data after FIN", nil, []arrival{{0, imm(KindFIN, 0, 0)}, {1, imm(KindData, 0, 0)}}, ErrAfterFIN},
		{"second FIN", nil, []arrival{{0, imm(KindFIN, 0, 0)}, {0, imm(KindCredit, 0, 0)}, {0, imm(KindFIN, 0, 0)}}, ErrAfterFIN},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEndpoint(t, p, p)
			if tt.setup != nil {
				tt.setup(t, e)
			}
			for i, m := range tt.msgs {
				_, err := e.OnArrival(m.byteLen, m.imm)
				if i < len(tt.msgs)-1 {
					require.NoError(t, err, "message %d", i)
					continue
				}
				if !errors.Is(err, tt.want) {
					t.Fatalf("OnArrival(%d, %#08x) = %v, want %v", m.byteLen, m.imm, err, tt.want)
				}
			}
			// The violation is sticky.
			err := e.Err()
			require.ErrorIs(t, err, tt.want)
			_, err2 := e.OnArrival(0, imm(KindCredit, 0, 0))
			require.Equal(t, err, err2, "OnArrival after a violation")
			_, err2 = e.ReserveData(1)
			require.Equal(t, err, err2, "ReserveData after a violation")
			_, ok := e.NextControl()
			require.False(t, ok, "NextControl after a violation")
			_, ok = e.Keepalive()
			require.False(t, ok, "Keepalive after a violation")
			require.Zero(t, e.Writable(), "Writable after a violation")
		})
	}
}

// TestCreditReturn: the receiver returns WQE credit for every message and ring credit
// for consumed bytes, piggybacked when it has traffic, standalone when a threshold is
// crossed, and the sender's credit grows by exactly that.
func TestCreditReturn(t *testing.T) {
	p := Params{RingSize: MinRingSize, RecvWQEs: 8} // updates at 4 WQEs or 2048 bytes
	a := newTestEndpoint(t, p, p)
	b := newTestEndpoint(t, p, p)

	// Three 100-byte messages: not yet worth an update.
	for range 3 {
		r, err := a.ReserveData(100)
		require.NoError(t, err)
		deliver(t, b, r.Msgs[0])
	}
	require.Equal(t, uint64(5), a.credit())
	_, ok := b.NextControl()
	require.False(t, ok, "update for 3 of 8 WQEs")
	require.NoError(t, b.Consume(250))

	// b writes: its data carries the credit back.
	r, err := b.ReserveData(10)
	require.NoError(t, err)
	got, err := DecodeImm(r.Msgs[0].Imm, 10)
	require.NoError(t, err)
	require.Equal(t, Imm{Kind: KindData, WQECredits: 3, RingCredits: 250}, got)
	arr, err := a.OnArrival(10, r.Msgs[0].Imm)
	require.NoError(t, err)
	require.True(t, arr.Credited)
	require.Equal(t, uint64(8), a.credit())
	require.Equal(t, MinRingSize-50, a.Writable())

	// The fourth message owed makes an update due, with the one from b's data.
	for range 3 {
		r, err := a.ReserveData(1)
		require.NoError(t, err)
		deliver(t, b, r.Msgs[0])
	}
	_, ok = b.NextControl()
	require.False(t, ok, "update for 3 of 8 WQEs")
	r, err = a.ReserveData(1)
	require.NoError(t, err)
	deliver(t, b, r.Msgs[0])
	m, ok := b.NextControl()
	require.True(t, ok, "no update for 4 of 8 WQEs")
	got, err = DecodeImm(m.Imm, 0)
	require.NoError(t, err)
	require.Equal(t, Imm{Kind: KindCredit, WQECredits: 4}, got)
	_, ok = b.NextControl()
	require.False(t, ok, "a second update with nothing owed")
	deliver(t, a, m)
	require.Equal(t, uint64(8), a.credit())
	require.Equal(t, uint64(1), a.reaped-a.wqeReturned, "a owes b one WQE for its update")
}

// TestCreditCarriedOver: credit that does not fit one immediate is returned by the next
// messages, all of it.
func TestCreditCarriedOver(t *testing.T) {
	p := Params{RingSize: MinRingSize, RecvWQEs: 2048}
	a := newTestEndpoint(t, p, p)
	b := newTestEndpoint(t, p, p)
	for range 600 {
		m, ok := a.Keepalive()
		require.True(t, ok)
		deliver(t, b, m)
	}
	var returned []uint32
	for {
		m, ok := b.NextControl()
		if !ok {
			break
		}
		got, err := DecodeImm(m.Imm, 0)
		require.NoError(t, err)
		returned = append(returned, got.WQECredits)
		deliver(t, a, m)
	}
	require.Equal(t, []uint32{MaxImmWQECredits}, returned, "standalone updates for 600 owed WQEs")
	r, err := b.ReserveData(1)
	require.NoError(t, err)
	got, err := DecodeImm(r.Msgs[0].Imm, 1)
	require.NoError(t, err)
	require.Equal(t, uint32(600-MaxImmWQECredits), got.WQECredits, "the rest rides on the next message")
	deliver(t, a, r.Msgs[0])
	require.Equal(t, uint64(2048), a.credit())
}

// TestFIN: CloseWrite ends writes, the FIN follows the data and waits for credit, and
// never takes the last credit unless it returns WQE credit.
func TestFIN(t *testing.T) {
	a := newTestEndpoint(t, minParams, minParams)
	b := newTestEndpoint(t, minParams, minParams)
	r, err := a.ReserveData(10)
	require.NoError(t, err)
	r2, err := a.ReserveData(10)
	require.NoError(t, err)
	require.Zero(t, a.Writable(), "data took the reserve")
	a.CloseWrite()
	_, err = a.ReserveData(1)
	require.ErrorIs(t, err, ErrWriteClosed)
	_, err = a.ReserveData(0)
	require.ErrorIs(t, err, ErrWriteClosed)

	// Two credits left, the reserve: the FIN may use it.
	require.True(t, a.FINPending())
	fin, ok := a.NextControl()
	require.True(t, ok, "FIN held back with %d credits", a.credit())
	require.False(t, a.FINPending())
	_, ok = a.NextControl()
	require.False(t, ok, "a second FIN")
	a.CloseWrite()
	_, ok = a.NextControl()
	require.False(t, ok, "CloseWrite twice sent a second FIN")

	deliver(t, b, r.Msgs[0], r2.Msgs[0])
	require.False(t, b.PeerClosed())
	arr, err := b.OnArrival(0, fin.Imm)
	require.NoError(t, err)
	require.Equal(t, KindFIN, arr.Kind)
	require.True(t, b.PeerClosed())
	require.Equal(t, 20, b.Buffered(), "data before the FIN is still readable")

	// b closes too, with one credit left and nothing to return: the FIN must wait.
	c := newTestEndpoint(t, minParams, minParams)
	c.sent = c.wqeLimit - 1
	c.CloseWrite()
	_, ok = c.NextControl()
	require.False(t, ok, "FIN took the last credit without returning any")
	_, err = c.OnArrival(0, imm(KindCredit, 0, 0)) // now c owes one WQE
	require.NoError(t, err)
	fin, ok = c.NextControl()
	require.True(t, ok, "FIN with the last credit, returning one")
	got, err := DecodeImm(fin.Imm, 0)
	require.NoError(t, err)
	require.Equal(t, Imm{Kind: KindFIN, WQECredits: 1}, got)
}

func TestKeepalive(t *testing.T) {
	e := newTestEndpoint(t, minParams, minParams)
	for range MinRecvWQEs - ReservedCredits {
		_, ok := e.Keepalive()
		require.True(t, ok)
	}
	_, ok := e.Keepalive()
	require.False(t, ok, "keepalive took reserved credit")
	_, ok = e.NextControl()
	require.False(t, ok, "control message with nothing due")
	require.Equal(t, uint64(MinRecvWQEs-ReservedCredits), e.Stats().ControlSent)
}

// FuzzPeer drives an Endpoint with arbitrary messages from its peer, mixed with local
// writes, reads and control messages. Whatever arrives, the Endpoint must not panic, must
// report every violation as one of its errors, and must never accept a message that
// would have overwritten unread bytes, found no WQE, or returned credit never used.
func FuzzPeer(f *testing.F) {
	f.Add([]byte{})
	f.Add(fuzzOps(
		fuzzOp{op: 2, a: 10},                          // write 10 bytes
		fuzzOp{op: 1, a: 5, b: 1<<8 | 10<<16},         // peer: 5 data bytes returning 1 WQE, 10 bytes
		fuzzOp{op: 3, a: 5},                           // read them
		fuzzOp{op: 4},                                 // control
		fuzzOp{op: 1, a: 0, b: 2},                     // peer: FIN
		fuzzOp{op: 0, a: 1, b: imm(KindData, 0, 0)},   // peer: data after FIN
		fuzzOp{op: 0, a: 0, b: imm(KindCredit, 9, 0)}, // peer: credit never used
	))
	f.Add(fuzzOps(fuzzOp{op: 0, a: 64, b: imm(KindData, 0, 0)}, fuzzOp{op: 0, a: 1, b: imm(KindData, 0, 0)}))
	f.Add(fuzzOps(
		fuzzOp{op: 8, a: PlaceUnit}, // advertise
		fuzzOp{op: 4},               // hand it out
		fuzzOp{op: 12, a: 10, b: 1}, // peer: 11 bytes placed
		fuzzOp{op: 8, a: PlaceUnit}, // advertise again
		fuzzOp{op: 4},
		fuzzOp{op: 1, a: 5, b: 0},  // peer: data, making it stale
		fuzzOp{op: 12, a: 0, b: 1}, // peer: placed after the data
	))
	f.Add(fuzzOps(
		fuzzOp{op: 2, a: 10},                // write 10 bytes
		fuzzOp{op: 12, a: 32, b: 0 | 1<<8},  // peer: advertisement at the cursor
		fuzzOp{op: 11, a: 7},                // place
		fuzzOp{op: 12, a: 33, b: 0 | 1<<8},  // peer: advertisement one byte behind
		fuzzOp{op: 4},                       // the decline
		fuzzOp{op: 12, a: 0, b: 3},          // peer: cancel
		fuzzOp{op: 12, a: 0, b: 0 | 2<<8},   // peer: advertisement past the cursor
		fuzzOp{op: 0, a: 0, b: 0xe008_0000}, // peer: raw decline
		fuzzOp{op: 10}, fuzzOp{op: 9}, fuzzOp{op: 5},
	))
	f.Fuzz(func(t *testing.T, ops []byte) {
		const ring, wqes, growTo = 64, 4, 12
		p := Params{RingSize: ring, RecvWQEs: wqes, GrowWQEsTo: growTo}
		e := newEndpoint(p, p)
		peerRing, ownRing := uint64(ring), uint64(ring) // the largest each ring has been
		for len(ops) >= 9 {
			op, a, b := ops[0], binary.LittleEndian.Uint32(ops[1:]), binary.LittleEndian.Uint32(ops[5:])
			ops = ops[9:]
			switch op % 16 {
			case 0: // raw completion; an advertisement's payload names our cursor
				fuzzArrival(t, &e, a, b, uint32(e.prod))
			case 1: // well-formed completion with fuzzed fields
				kind := Kind(1 + b%4)
				n := a % (2 * ring)
				if kind != KindData {
					n = 0
				} else if n == 0 {
					n = 1
				}
				fuzzArrival(t, &e, n, imm(kind, (b>>8)%8, (b>>16)%(2*ring)), 0)
			case 2:
				r, err := e.ReserveData(int(a % (2 * ring)))
				if err == nil && r.Bytes > int(a%(2*ring)) {
					t.Fatalf("ReserveData(%d) reserved %d bytes", a%(2*ring), r.Bytes)
				}
			case 3:
				if err := e.Consume(int(a % uint32(e.Buffered()+2))); err != nil && !errors.Is(err, ErrBadLength) {
					t.Fatalf("Consume: %v", err)
				}
			case 4:
				e.NextControl()
			case 5:
				e.CloseWrite()
			case 6:
				e.Keepalive()
			case 7: // this side resizes its ring
				if err := e.Resize(int(a % (8 * ring))); err != nil && !errors.Is(err, ErrBadParams) && !errors.Is(err, ErrResizeBusy) && err != e.err {
					t.Fatalf("Resize: %v", err)
				}
			case 8: // this side's reader advertises a buffer
				if _, err := e.Advertise(int(a % (3 * PlaceUnit))); err != nil && !errors.Is(err, ErrBadLength) && !errors.Is(err, ErrPlaceBusy) && err != e.err {
					t.Fatalf("Advertise: %v", err)
				}
			case 9:
				e.CancelAdvert()
			case 10:
				e.declinePlace()
			case 11: // this side's writer places
				p := e.Placeable()
				m, err := e.ReservePlace(int(a % uint32(p+2)))
				switch {
				case err == nil && (m.Len == 0 || m.Len > p || m.Kind != KindPlace):
					t.Fatalf("ReservePlace(%d) = %+v with %d placeable", a%uint32(p+2), m, p)
				case err != nil && !errors.Is(err, ErrBadLength) && err != e.err:
					t.Fatalf("ReservePlace: %v", err)
				}
			case 12: // well-formed placement message with fuzzed fields, the cursor near ours
				op := PlaceOp(b % 4)
				units := uint32(0)
				n := map[PlaceOp]uint32{PlaceAdvert: AdvertLen, PlacePlaced: 1 + a%(2*PlaceUnit)}[op]
				if op == PlaceAdvert {
					units = 1 + (b>>8)%4
				}
				fuzzArrival(t, &e, n, placeImm(op, (b>>16)%8, units), uint32(e.prod)+ring/2-a%(2*ring))
			case 13: // this side adds receive WQEs
				if err := e.GrowWQEs(int(a%8) - 1); err != nil && !errors.Is(err, ErrBadParams) && err != e.err {
					t.Fatalf("GrowWQEs: %v", err)
				}
			}
			peerRing, ownRing = max(peerRing, e.peerRing, e.switchTo), max(ownRing, e.ring, e.resizing)
			if e.sent > e.wqeLimit || e.granted > e.prod || e.prod-e.granted > peerRing ||
				e.returned > e.consumed || e.consumed > e.arrived || e.arrived-e.returned > ownRing ||
				e.owedWQEs() > e.wqes || e.wqes > growTo || e.peerWQEs > growTo || e.wqeLimit-e.peerWQEs > e.sent {
				t.Fatalf("invariant broken: %+v", e)
			}
			// One advertisement at a time each way, of whole units; one placeable only
			// at our cursor, once its cursor is known.
			if e.advertTo%PlaceUnit != 0 || e.advert%PlaceUnit != 0 || e.peerAdvert%PlaceUnit != 0 ||
				(e.advertTo != 0 && e.advert != 0) || (e.err == nil && e.peerAdvertNew) ||
				uint64(e.Placeable()) > e.peerAdvert || (e.Placeable() > 0 && e.peerAdvertAt != e.prod) ||
				(e.advert != 0 && e.advertAt > e.arrived) {
				t.Fatalf("placement invariant broken: %+v", e)
			}
		}
	})
}

// fuzzArrival passes a completion to e, and then, for an advertisement, lo32 to
// PeerAdvert as the engine would.
func fuzzArrival(t *testing.T, e *Endpoint, byteLen, im, lo32 uint32) {
	before := e.err
	a, err := e.OnArrival(byteLen, im)
	if err == nil && a.Kind == KindPlace && a.Op == PlaceAdvert {
		if err = e.PeerAdvert(lo32); err != nil && !errors.Is(err, ErrBadPlace) {
			t.Fatalf("PeerAdvert(%#x) = %v, not a protocol violation", lo32, err)
		}
	}
	switch {
	case err == nil:
	case before != nil:
		if err != before {
			t.Fatalf("OnArrival after a violation = %v, want the first error %v", err, before)
		}
	case !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrRingOverrun) && !errors.Is(err, ErrWQEOverrun) &&
		!errors.Is(err, ErrCreditOverflow) && !errors.Is(err, ErrAfterFIN) && !errors.Is(err, ErrBadResize) &&
		!errors.Is(err, ErrBadPlace):
		t.Fatalf("OnArrival(%d, %#08x) = %v, not a protocol violation", byteLen, im, err)
	}
}

type fuzzOp struct {
	op   byte
	a, b uint32
}

func fuzzOps(ops ...fuzzOp) []byte {
	var b []byte
	for _, o := range ops {
		b = append(b, o.op)
		b = binary.LittleEndian.AppendUint32(b, o.a)
		b = binary.LittleEndian.AppendUint32(b, o.b)
	}
	return b
}

// TestSpillable: the engine spills from half a ring buffered, up to its room, once the
// peer holds no ring credit, never after the FIN; spilled bytes are consumed like read
// ones, so their credit goes back and the writer goes on although nobody reads.
func TestSpillable(t *testing.T) {
	const ring = MinRingSize
	p := Params{RingSize: ring, RecvWQEs: 64}
	tests := []struct {
		name     string
		arrived  int  // bytes delivered
		consumed int  // of them, read (their credit not handed out)
		fin      bool // the peer's FIN follows them
		room     int
		want     int
	}{
		{"nothing buffered", 0, 0, false, 1 << 20, 0},
		{"half the ring, the peer holds credit", ring / 2, 0, false, 1 << 20, 0},
		{"all but a byte, the peer holds credit", ring - 1, 0, false, 1 << 20, 0},
		{"below half the ring, the peer without credit", ring, ring/2 + 1, false, 1 << 20, 0},
		{"half the ring, the peer without credit", ring, ring / 2, false, 1 << 20, ring / 2},
		{"a full ring", ring, 0, false, 1 << 20, ring},
		{"room for part", ring, 0, false, 100, 100},
		{"no room", ring, 0, false, 0, 0},
		{"negative room", ring, 0, false, -5, 0},
		{"after the FIN", ring, 0, true, 1 << 20, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTestEndpoint(t, p, p)
			b := newTestEndpoint(t, p, p)
			if tt.arrived > 0 {
				r, err := a.ReserveData(tt.arrived)
				require.NoError(t, err)
				deliver(t, b, r.Msgs[:r.Count]...)
			}
			require.NoError(t, b.Consume(tt.consumed))
			if tt.fin {
				a.CloseWrite()
				m, ok := a.NextControl()
				require.True(t, ok)
				deliver(t, b, m)
			}
			if got := b.Spillable(tt.room); got != tt.want {
				t.Errorf("Spillable(%d) with %d of %d bytes arrived, %d consumed, FIN %v = %d, want %d",
					tt.room, tt.arrived, ring, tt.consumed, tt.fin, got, tt.want)
			}
		})
	}

	// Nobody reads at b: spilling whatever Spillable says keeps a writing forever.
	a := newTestEndpoint(t, p, p)
	b := newTestEndpoint(t, p, p)
	var spilled int
	for range 100 {
		r, err := a.ReserveData(ring / 4)
		require.NoError(t, err)
		require.Equal(t, ring/4, r.Bytes, "a is blocked after %d bytes, %d spilled", a.prod, spilled)
		deliver(t, b, r.Msgs[:r.Count]...)
		if n := b.Spillable(1 << 30); n > 0 {
			first, second := b.Unread()
			require.Equal(t, n, first.Len+second.Len, "Spillable hands out everything buffered")
			require.NoError(t, b.Consume(n))
			spilled += n
		}
		for {
			m, ok := b.NextControl()
			if !ok {
				break
			}
			deliver(t, a, m)
		}
	}
	require.Equal(t, uint64(spilled), b.consumed, "the consumer cursor counts the spilled bytes")
	require.Equal(t, 100*ring/4, spilled+b.Buffered())
}

// TestPeerRingCredit: the peer may write a ring's worth, less what arrived, plus what
// this side returned; consumed bytes count only once their credit is handed out.
func TestPeerRingCredit(t *testing.T) {
	const ring = MinRingSize
	p := Params{RingSize: ring, RecvWQEs: 64}
	tests := []struct {
		name     string
		arrive   int  // bytes delivered to b
		consume  int  // of them, consumed by b's reader
		giveBack bool // b hands out the update its consumption made due, if any
		want     int
	}{
		{"nothing arrived", 0, 0, false, ring},
		{"part arrived", ring / 4, 0, false, ring - ring/4},
		{"a full ring", ring, 0, false, 0},
		{"consumed, credit not handed out", ring, ring, false, 0},
		{"consumed and returned", ring, ring, true, ring},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTestEndpoint(t, p, p)
			b := newTestEndpoint(t, p, p)
			for left := tt.arrive; left > 0; {
				r, err := a.ReserveData(left)
				require.NoError(t, err)
				deliver(t, b, r.Msgs[:r.Count]...)
				left -= r.Bytes
			}
			require.NoError(t, b.Consume(tt.consume))
			if tt.giveBack {
				_, ok := b.NextControl()
				require.True(t, ok, "an update due after %d bytes consumed", tt.consume)
			}
			if got := b.PeerRingCredit(); got != tt.want {
				t.Errorf("PeerRingCredit() after %d bytes arrived, %d consumed, returned %v = %d, want %d", tt.arrive, tt.consume, tt.giveBack, got, tt.want)
			}
		})
	}
}

// TestCreditNow: an early credit update carries the ring credit owed once an eighth of
// the ring, or CreditNowMin on a large ring, (and at least a unit) is consumed, below
// the threshold of a standalone update (half); there is none with less owed, nor with
// the WQE credit down to the reserve, which only the rules of the package docs may spend.
func TestCreditNow(t *testing.T) {
	tests := []struct {
		name       string
		ring       int
		consume    int
		exhaustWQE bool // b has used its WQE credit down to the reserve
		want       bool
	}{
		{"nothing consumed", 64 << 10, 0, false, false},
		{"a unit", 64 << 10, 1, false, false},
		{"just below an eighth", 64 << 10, 8<<10 - 1, false, false},
		{"an eighth", 64 << 10, 8 << 10, false, true},
		{"a quarter", 64 << 10, 16 << 10, false, true},
		{"no WQE credit to spare", 64 << 10, 16 << 10, true, false},
		{"large ring: just below CreditNowMin", 4 << 20, CreditNowMin - RingUnit(4<<20), false, false},
		{"large ring: CreditNowMin, far below an eighth", 4 << 20, CreditNowMin, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ring := tt.ring
			p := Params{RingSize: ring, RecvWQEs: 64}
			unit := RingUnit(ring)
			a := newTestEndpoint(t, p, p)
			b := newTestEndpoint(t, p, p)
			r, err := a.ReserveData(ring / 2)
			require.NoError(t, err)
			deliver(t, b, r.Msgs[:r.Count]...)
			require.NoError(t, b.Consume(tt.consume))
			if tt.exhaustWQE {
				for b.Writable() > 0 {
					_, err := b.ReserveData(1)
					require.NoError(t, err)
				}
			}
			before := b.PeerRingCredit()
			m, ok := b.CreditNow()
			require.Equal(t, tt.want, ok, "CreditNow after %d bytes consumed", tt.consume)
			if !ok {
				require.Equal(t, before, b.PeerRingCredit(), "credit handed out without a message")
				return
			}
			require.Equal(t, KindCredit, m.Kind)
			dec, err := DecodeImm(m.Imm, 0)
			require.NoError(t, err)
			require.Equal(t, tt.consume/unit, int(dec.RingCredits), "ring units carried")
			require.Equal(t, before+tt.consume/unit*unit, b.PeerRingCredit())
			deliver(t, a, m) // the peer accepts it
		})
	}
}

// TestMakeEndpoint checks that MakeEndpoint builds what NewEndpoint points to, rejects
// what it rejects, and allocates nothing for a connection that keeps the state inline.
func TestMakeEndpoint(t *testing.T) {
	good := Params{RingSize: MinRingSize, RecvWQEs: MinRecvWQEs}
	tests := []struct {
		name        string
		local, peer Params
		ok          bool
	}{
		{"valid", good, Params{RingSize: 2 * MinRingSize, RecvWQEs: 2 * MinRecvWQEs}, true},
		{"local ring not a power of two", Params{RingSize: MinRingSize + 1, RecvWQEs: MinRecvWQEs}, good, false},
		{"peer WQEs too few", good, Params{RingSize: MinRingSize, RecvWQEs: MinRecvWQEs - 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := MakeEndpoint(tt.local, tt.peer)
			p, perr := NewEndpoint(tt.local, tt.peer)
			if !tt.ok {
				require.ErrorIs(t, err, ErrBadParams, "MakeEndpoint(%+v, %+v)", tt.local, tt.peer)
				require.Equal(t, perr, err, "NewEndpoint's error and MakeEndpoint's for (%+v, %+v)", tt.local, tt.peer)
				return
			}
			require.NoError(t, err)
			require.NoError(t, perr)
			require.Equal(t, *p, e, "MakeEndpoint(%+v, %+v) against *NewEndpoint", tt.local, tt.peer)
			allocs := testing.AllocsPerRun(10, func() { e, _ = MakeEndpoint(tt.local, tt.peer) })
			require.Zero(t, allocs, "allocations of MakeEndpoint(%+v, %+v)", tt.local, tt.peer)
		})
	}
}
