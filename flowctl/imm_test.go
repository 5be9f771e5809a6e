package flowctl

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestImmLayout(t *testing.T) {
	tests := []struct {
		m    Imm
		want uint32
	}{
		{Imm{Kind: KindData}, 0x2000_0000},
		{Imm{Kind: KindCredit, WQECredits: 1}, 0x4010_0000},
		{Imm{Kind: KindFIN, RingCredits: 1}, 0x6000_0001},
		{Imm{Kind: KindKeepalive, WQECredits: MaxImmWQECredits, RingCredits: MaxImmRingCredits}, 0x9fff_ffff},
		{Imm{Kind: KindData, WQECredits: 0x155, RingCredits: 0xaaaaa}, 0x355a_aaaa},
		{Imm{Kind: KindResize, WQECredits: 3, RingLog2: 17}, 0xa030_0011},
		{Imm{Kind: KindSwitch, WQECredits: 1, RingCredits: 2}, 0xc010_0002},
	}
	for _, tt := range tests {
		got, err := tt.m.Encode()
		if err != nil || got != tt.want {
			t.Errorf("%+v.Encode() = %#08x, %v, want %#08x", tt.m, got, err, tt.want)
		}
	}
}

func TestImmRoundTrip(t *testing.T) {
	for _, log2 := range []uint8{0, 12, 17, 30} {
		m := Imm{Kind: KindResize, WQECredits: 5, RingLog2: log2}
		imm, err := m.Encode()
		require.NoError(t, err, "%+v.Encode()", m)
		got, err := DecodeImm(imm, ResizeLen)
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	for _, kind := range []Kind{KindData, KindCredit, KindFIN, KindKeepalive, KindSwitch} {
		for _, wqe := range []uint32{0, 1, 2, 255, MaxImmWQECredits} {
			for _, ring := range []uint32{0, 1, 1 << 18, MaxImmRingCredits} {
				m := Imm{Kind: kind, WQECredits: wqe, RingCredits: ring}
				imm, err := m.Encode()
				require.NoError(t, err, "%+v.Encode()", m)
				byteLen := uint32(0)
				if kind == KindData {
					byteLen = 7
				}
				got, err := DecodeImm(imm, byteLen)
				if err != nil || got != m {
					t.Errorf("DecodeImm(%+v.Encode() = %#08x, %d) = %+v, %v, want it back", m, imm, byteLen, got, err)
				}
			}
		}
	}
}

func TestImmEncodeRejects(t *testing.T) {
	tests := []Imm{
		{},
		{Kind: KindPlace}, // an advertisement of nothing
		{Kind: 8},
		{Kind: 255},
		{Kind: KindResize, RingCredits: 1},
		{Kind: KindResize, RingLog2: 31},
		{Kind: KindSwitch, RingLog2: 1},
		{Kind: KindData, RingLog2: 12},
		{Kind: KindData, WQECredits: MaxImmWQECredits + 1},
		{Kind: KindCredit, RingCredits: MaxImmRingCredits + 1},
		{Kind: KindFIN, WQECredits: 1 << 31},
	}
	for _, m := range tests {
		if imm, err := m.Encode(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v.Encode() = %#08x, %v, want ErrMalformed", m, imm, err)
		}
	}
}

func TestDecodeImmRejects(t *testing.T) {
	tests := []struct {
		imm, byteLen uint32
	}{
		{0, 0},                     // kind 0: memory never written
		{0, 10},                    //
		{0x0000_0001, 0},           // kind 0 with credit
		{0xa000_0000, 0},           // resize without its payload
		{0xa000_000c, 8},           // resize with a short payload
		{0xa000_001f, ResizeLen},   // resize to 2^31 bytes
		{0xa000_0100, ResizeLen},   // resize to 2^256 bytes
		{0xc000_0000, 1},           // switch with bytes
		{0xe000_0000, 1},           // advertisement of nothing, with one byte
		{0xffff_ffff, 0},           // all ones
		{0x2000_0000, 0},           // data without bytes
		{0x2010_0001, 0},           // data without bytes, with credit
		{0x4000_0000, 1},           // credit update with bytes
		{0x6000_0000, 4096},        // FIN with bytes
		{0x8000_0000, 0xffff_ffff}, // keepalive with bytes
	}
	for _, tt := range tests {
		if m, err := DecodeImm(tt.imm, tt.byteLen); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeImm(%#08x, %d) = %+v, %v, want ErrMalformed", tt.imm, tt.byteLen, m, err)
		}
	}
}

func TestKindString(t *testing.T) {
	tests := []struct {
		k    Kind
		want string
	}{
		{KindData, "data"}, {KindCredit, "credit"}, {KindFIN, "fin"}, {KindKeepalive, "keepalive"},
		{KindResize, "resize"}, {KindSwitch, "switch"}, {KindPlace, "place"}, {0, "Kind(0)"}, {9, "Kind(9)"},
	}
	for _, tt := range tests {
		if got := tt.k.String(); got != tt.want {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(tt.k), got, tt.want)
		}
	}
}

// FuzzDecodeImm checks that decoding never panics, accepts exactly the immediates whose
// kind is known and matches the byte length, and that every accepted immediate encodes
// back to itself, so no two wire values mean the same thing.
func FuzzDecodeImm(f *testing.F) {
	f.Add(uint32(0x2000_0000), uint32(1))
	f.Add(uint32(0x4010_0040), uint32(0))
	f.Add(uint32(0x6000_0000), uint32(0))
	f.Add(uint32(0x9fff_ffff), uint32(0))
	f.Add(uint32(0), uint32(0))
	f.Add(uint32(0x2000_0000), uint32(0))
	f.Add(uint32(0xe010_0003), uint32(AdvertLen)) // advertisement of 3 units
	f.Add(uint32(0xe000_0000), uint32(AdvertLen)) // advertisement of nothing
	f.Add(uint32(0xe003_ffff), uint32(0))         // advertisement without its payload
	f.Add(uint32(0xe004_0000), uint32(4096))      // placed
	f.Add(uint32(0xe004_0000), uint32(0))         // placed, no bytes
	f.Add(uint32(0xe004_0001), uint32(1))         // placed, naming a length
	f.Add(uint32(0xe008_0000), uint32(0))         // decline
	f.Add(uint32(0xe008_0000), uint32(1))         // decline with a byte
	f.Add(uint32(0xfffc_0000), uint32(0))         // cancel
	f.Add(uint32(0xffff_ffff), uint32(0))         // cancel naming a length
	f.Fuzz(func(t *testing.T, imm, byteLen uint32) {
		m, err := DecodeImm(imm, byteLen)
		kind := Kind(imm >> 29)
		op, units := PlaceOp(imm>>18&3), imm&(1<<18-1)
		valid := (kind == KindData && byteLen > 0) ||
			(kind == KindResize && byteLen == ResizeLen && imm&MaxImmRingCredits <= 30) ||
			((kind == KindCredit || kind == KindFIN || kind == KindKeepalive || kind == KindSwitch) && byteLen == 0) ||
			(kind == KindPlace && op == PlaceAdvert && byteLen == AdvertLen && units != 0) ||
			(kind == KindPlace && op == PlacePlaced && byteLen > 0 && units == 0) ||
			(kind == KindPlace && op >= PlaceDecline && byteLen == 0 && units == 0)
		if !valid {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeImm(%#08x, %d) = %+v, %v, want ErrMalformed", imm, byteLen, m, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("DecodeImm(%#08x, %d) = %v, want success", imm, byteLen, err)
		}
		if m.Kind != kind || m.WQECredits > MaxImmWQECredits || m.RingCredits > MaxImmRingCredits || m.RingLog2 > 30 ||
			m.Op > PlaceCancel || m.PlaceUnits > placeUnitsMask || (kind == KindPlace && (m.Op != op || m.PlaceUnits != units || m.RingCredits != 0)) ||
			(kind != KindPlace && (m.Op != 0 || m.PlaceUnits != 0)) {
			t.Fatalf("DecodeImm(%#08x, %d) = %+v, out of range", imm, byteLen, m)
		}
		back, err := m.Encode()
		if err != nil || back != imm {
			t.Fatalf("DecodeImm(%#08x, %d) = %+v, which encodes to %#08x, %v", imm, byteLen, m, back, err)
		}
	})
}
