package echosvc

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

func TestCodecRegistered(t *testing.T) {
	require.IsType(t, Codec{}, encoding.GetCodecV2(CodecName))
}

func TestCodecRoundTrip(t *testing.T) {
	for _, size := range []int{0, 1, 1000, 1 << 20} {
		in := &Message{Data: Fill(3, size)}
		wire, err := Codec{}.Marshal(in)
		require.NoError(t, err)
		require.Equal(t, size, wire.Len(), "Marshal of %d bytes", size)
		// Split the wire bytes in two buffers, as a transport may hand them over.
		flat := wire.Materialize()
		half := len(flat) / 2
		split := mem.BufferSlice{mem.SliceBuffer(flat[:half]), mem.SliceBuffer(flat[half:])}
		out := new(Message)
		require.NoError(t, Codec{}.Unmarshal(split, out))
		require.True(t, bytes.Equal(in.Data, out.Data), "Unmarshal(Marshal(%d bytes)) differs", size)
	}
}

func TestCodecWrongType(t *testing.T) {
	_, err := Codec{}.Marshal("not a message")
	require.ErrorContains(t, err, "cannot marshal string")
	require.ErrorContains(t, Codec{}.Unmarshal(nil, new(string)), "cannot unmarshal into *string")
}

func TestParseGenerateRequest(t *testing.T) {
	tests := []struct {
		name        string
		req         *Message
		count, size int
		code        codes.Code
	}{
		{"zero", GenerateRequest(0, 0), 0, 0, codes.OK},
		{"some", GenerateRequest(10, 4096), 10, 4096, codes.OK},
		{"limits", GenerateRequest(MaxGenerateCount, MaxGenerateSize), MaxGenerateCount, MaxGenerateSize, codes.OK},
		{"too many", GenerateRequest(MaxGenerateCount+1, 1), 0, 0, codes.InvalidArgument},
		{"too big", GenerateRequest(1, MaxGenerateSize+1), 0, 0, codes.InvalidArgument},
		{"short", &Message{Data: make([]byte, 15)}, 0, 0, codes.InvalidArgument},
		{"long", &Message{Data: make([]byte, 17)}, 0, 0, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			count, size, err := ParseGenerateRequest(tt.req)
			require.Equal(t, tt.code, status.Code(err), "ParseGenerateRequest(%x) error %v", tt.req.Data, err)
			require.Equal(t, tt.count, count)
			require.Equal(t, tt.size, size)
		})
	}
}

func TestFillDiffers(t *testing.T) {
	seen := make(map[string]int)
	for i := range 256 {
		s := string(Fill(i, 512))
		j, dup := seen[s]
		require.False(t, dup, "Fill(%d, 512) == Fill(%d, 512)", i, j)
		seen[s] = i
	}
}
