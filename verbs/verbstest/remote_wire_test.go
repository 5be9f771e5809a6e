package verbstest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// frame returns body as one frame.
func frame(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func TestFrameRoundTrip(t *testing.T) {
	calls := []call{
		{Op: "bye"},
		{Op: "regMR", H: 3, N: 65536, Access: allAccess},
		{Op: "toRTR", H: 9, RTR: &verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: 0x11, Dest: verbs.AddressVector{DestGID: verbs.GID{15: 1}, IsGlobal: true}}},
		{Op: "postSend", H: 9, Send: []verbs.SendWR{{ID: 1, Opcode: verbs.OpRDMAWriteWithImm, Imm: 7, SGL: []verbs.SGE{{Addr: 1 << 40, Length: 8, LKey: 5}}}}},
		{Op: "write", H: 4, Off: 12, Data: []byte("hello")},
	}
	for _, c := range calls {
		var buf bytes.Buffer
		require.NoError(t, writeFrame(&buf, c))
		var got call
		require.NoError(t, readFrame(&buf, &got))
		require.Equal(t, c, got, "readFrame(writeFrame(%+v))", c)
		require.ErrorIs(t, readFrame(&buf, &got), io.EOF, "after the last frame")
	}
}

func TestReadFrameRefuses(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
	}{
		{"short header", []byte{0, 0}},
		{"too long", binary.BigEndian.AppendUint32(nil, maxFrame+1)},
		{"truncated body", frame(`{"op":"bye"}`)[:8]},
		{"not JSON", frame("hello")},
		{"wrong type", frame(`{"op":17}`)},
	}
	for _, tc := range cases {
		var c call
		err := readFrame(bytes.NewReader(tc.in), &c)
		require.Error(t, err, "%s: readFrame(%q)", tc.name, tc.in)
		require.NotErrorIs(t, err, io.EOF, "%s: a broken frame is not a clean end", tc.name)
	}
}

// TestWireErrors checks that errors keep their sentinel and post index across the wire.
func TestWireErrors(t *testing.T) {
	cases := []struct {
		err   error
		is    error
		index int // -1: not a post error
	}{
		{fmt.Errorf("soft: QP 0x12: to ERROR from RESET: %w", verbs.ErrInvalidState), verbs.ErrInvalidState, -1},
		{&verbs.PostError{Index: 3, Err: verbs.ErrQueueFull}, verbs.ErrQueueFull, 3},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), context.DeadlineExceeded, -1},
		{errors.New("something else"), nil, -1},
	}
	for _, tc := range cases {
		got := encodeError(tc.err).decode()
		require.Error(t, got)
		if tc.is != nil {
			require.ErrorIs(t, got, tc.is, "decode(encode(%v))", tc.err)
		}
		var pe *verbs.PostError
		if tc.index >= 0 {
			require.ErrorAs(t, got, &pe)
			require.Equal(t, tc.index, pe.Index)
		} else {
			require.False(t, errors.As(got, &pe), "decode(encode(%v)) = %v is a post error", tc.err, got)
		}
	}
	require.NoError(t, encodeError(nil).decode())
}

// FuzzReadFrame feeds the frame decoder garbage: it must return an error or a call,
// never panic, and a call it returns must encode again.
func FuzzReadFrame(f *testing.F) {
	for _, s := range []string{
		`{"op":"bye"}`,
		`{"op":"poll","h":5,"n":16}`,
		`{"op":"postRecv","h":9,"recv":[{"ID":1,"SGL":[{"Addr":1,"Length":2,"LKey":3}]}]}`,
		`{"op":"toRTR","h":9,"rtr":{"PathMTU":3,"Dest":{"DestGID":[0,0,0,0,0,0,0,0,0,0,255,255,10,0,0,1]}}}`,
		`{"op":"write","h":4,"off":1,"data":"aGVsbG8="}`,
	} {
		f.Add(frame(s))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			var c call
			if err := readFrame(r, &c); err != nil {
				return
			}
			require.NoError(t, writeFrame(io.Discard, c))
		}
	})
}
