package soft

import (
	"testing"
	"time"

	"github.com/rsockio/rsock/verbs/internal/rc"
)

func TestRNRDelay(t *testing.T) {
	tests := []struct {
		enc   uint8
		scale float64
		want  time.Duration
	}{
		{0, 1, 655360 * time.Microsecond},
		{1, 1, 10 * time.Microsecond},
		{12, 1, 640 * time.Microsecond},
		{14, 1, 1280 * time.Microsecond},
		{31, 1, 491520 * time.Microsecond},
		{14, 0.5, 640 * time.Microsecond},
		{1, 0.001, minTimer}, // 10 ns, raised to the floor
	}
	for _, tc := range tests {
		if got := rnrDelay(tc.enc, tc.scale); got != tc.want {
			t.Errorf("rnrDelay(%d, %v) = %v, want %v", tc.enc, tc.scale, got, tc.want)
		}
	}
}

func TestACKTimeout(t *testing.T) {
	tests := []struct {
		enc   uint8
		scale float64
		want  time.Duration
	}{
		{0, 1, 0}, // wait forever
		{0, 0.01, 0},
		{1, 1, 8192 * time.Nanosecond},
		{14, 1, 67108864 * time.Nanosecond},
		{14, 0.25, 16777216 * time.Nanosecond},
		{31, 1, 4096 << 31 * time.Nanosecond},
	}
	for _, tc := range tests {
		if got := ackTimeout(tc.enc, tc.scale); got != tc.want {
			t.Errorf("ackTimeout(%d, %v) = %v, want %v", tc.enc, tc.scale, got, tc.want)
		}
	}
}

func TestPackets(t *testing.T) {
	tests := []struct{ n, mtu, want uint32 }{
		{0, 4096, 1}, {1, 4096, 1}, {4096, 4096, 1}, {4097, 4096, 2}, {1 << 31, 256, 1 << 23}, {10, 0, 1},
	}
	for _, tc := range tests {
		if got := packets(tc.n, tc.mtu); got != tc.want {
			t.Errorf("packets(%d, %d) = %d, want %d", tc.n, tc.mtu, got, tc.want)
		}
	}
}

func TestCopyHelpers(t *testing.T) {
	src := []byte("0123456789abcdef")
	split := func(b []byte, sizes ...int) [][]byte {
		var out [][]byte
		for _, n := range sizes {
			out, b = append(out, b[:n]), b[n:]
		}
		return out
	}
	tests := []struct {
		name      string
		src, dst  []int // buffer sizes
		wantBytes string
	}{
		{"one to one", []int{16}, []int{16}, "0123456789abcdef"},
		{"many to one", []int{3, 0, 13}, []int{16}, "0123456789abcdef"},
		{"one to many", []int{16}, []int{5, 0, 11}, "0123456789abcdef"},
		{"many to many", []int{7, 9}, []int{2, 2, 12}, "0123456789abcdef"},
		{"room to spare", []int{4}, []int{3, 13}, "0123\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"},
	}
	for _, tc := range tests {
		n := 0
		for _, s := range tc.src {
			n += s
		}
		out := make([]byte, 16)
		copyVec(split(out, tc.dst...), split(src[:n], tc.src...))
		if string(out) != tc.wantBytes {
			t.Errorf("%s: copyVec = %q, want %q", tc.name, out, tc.wantBytes)
		}
		if len(tc.dst) == 1 {
			out = make([]byte, 16)
			gather(out, split(src[:n], tc.src...))
			if string(out) != tc.wantBytes {
				t.Errorf("%s: gather = %q, want %q", tc.name, out, tc.wantBytes)
			}
		}
		if len(tc.src) == 1 {
			out = make([]byte, 16)
			scatter(split(out, tc.dst...), src[:n])
			if string(out) != tc.wantBytes {
				t.Errorf("%s: scatter = %q, want %q", tc.name, out, tc.wantBytes)
			}
		}
	}
}

func TestMRSlice(t *testing.T) {
	m := &MR{reg: rc.Region{Addr: 4096, Buf: make([]byte, 100)}}
	tests := []struct {
		addr uint64
		n    uint32
		ok   bool
	}{
		{4096, 100, true}, {4096, 0, true}, {4196, 0, true}, {4100, 96, true},
		{4095, 1, false}, {4100, 97, false}, {4197, 0, false}, {1<<64 - 1, 2, false}, {4096, 1 << 31, false},
	}
	for _, tc := range tests {
		b, ok := m.slice(tc.addr, tc.n)
		if ok != tc.ok || (ok && len(b) != int(tc.n)) {
			t.Errorf("slice(%#x, %d) = %d bytes, %v; want ok %v", tc.addr, tc.n, len(b), ok, tc.ok)
		}
	}
}
