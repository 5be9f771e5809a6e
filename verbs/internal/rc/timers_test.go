package rc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRNRDelay(t *testing.T) {
	tests := []struct {
		enc  uint8
		want time.Duration
	}{
		{0, 655360 * time.Microsecond},
		{1, 10 * time.Microsecond},
		{12, 640 * time.Microsecond},
		{31, 491520 * time.Microsecond},
		{32 + 1, 10 * time.Microsecond}, // the low 5 bits
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, RNRDelay(tt.enc), "RNRDelay(%d)", tt.enc)
	}
	for enc := uint8(2); enc < 32; enc++ {
		require.Greater(t, RNRDelay(enc), RNRDelay(enc-1), "RNRDelay(%d) after RNRDelay(%d)", enc, enc-1)
	}
}

func TestACKTimeout(t *testing.T) {
	tests := []struct {
		enc  uint8
		want time.Duration
	}{
		{0, 0}, // wait forever
		{1, 8192 * time.Nanosecond},
		{14, 67108864 * time.Nanosecond},
		{31, 4096 << 31 * time.Nanosecond},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, ACKTimeout(tt.enc), "ACKTimeout(%d)", tt.enc)
	}
}
