package shm

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWireRoundTrip(t *testing.T) {
	gid := [16]byte{0xfe, 0x80, 15: 7}
	tests := []struct {
		name string
		m    msg
	}{
		{"hello", msg{kind: msgHello, srcQPN: 0x123, dstQPN: 0xffffff, srcGID: gid}},
		{"write", msg{kind: msgRequest, op: opWriteWithImm, flags: reqSolicited | reqNotify, imm: 9, rkey: 3, length: 1 << 20, addr: 1 << 40}},
		{"send", msg{kind: msgRequest, op: opSend, length: 3, payload: []byte("abc")}},
		{"empty send", msg{kind: msgRequest, op: opSendWithImm, imm: 1}},
		{"read", msg{kind: msgRequest, op: opRead, rkey: 1, length: 8, addr: 4096}},
		{"query", msg{kind: msgMRQuery, rkey: 0xdeadbeef}},
		{"ack", msg{kind: msgResponse, respKind: respAck}},
		{"rnr", msg{kind: msgResponse, respKind: respRNR, rnrTimer: 12}},
		{"error", msg{kind: msgResponse, respKind: respErr, status: 10}},
		{"region", msg{kind: msgRegion, ok: true, rkey: 5, access: 7, addr: 1 << 32, size: 65536}},
		{"no region", msg{kind: msgRegion, rkey: 5}},
		{"doorbell", msg{kind: msgDoorbell}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.m.encode(nil)
			var got msg
			require.NoError(t, got.decode(b), "decode(encode(%+v))", tt.m)
			if len(got.payload) == 0 {
				got.payload = tt.m.payload
			}
			require.Equal(t, tt.m, got, "decode(encode(%+v))", tt.m)
		})
	}
}

func TestWireRejects(t *testing.T) {
	send := (&msg{kind: msgRequest, op: opSend, length: 3, payload: []byte("abc")}).encode(nil)
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"unknown kind", []byte{9, 0, 0, 0}},
		{"short hello", (&msg{kind: msgHello}).encode(nil)[:31]},
		{"bad magic", func() []byte { b := (&msg{kind: msgHello}).encode(nil); b[4] ^= 1; return b }()},
		{"bad version", func() []byte { b := (&msg{kind: msgHello}).encode(nil); b[1] = wireVersion + 1; return b }()},
		{"QPN over 24 bits", (&msg{kind: msgHello, srcQPN: 1 << 24}).encode(nil)},
		{"short request", send[:requestLen-1]},
		{"SEND length disagrees", send[:len(send)-1]},
		{"write with payload", append((&msg{kind: msgRequest, op: opWrite}).encode(nil), 1)},
		{"unknown opcode", (&msg{kind: msgRequest, op: 7}).encode(nil)},
		{"unknown flags", (&msg{kind: msgRequest, op: opWrite, flags: 4}).encode(nil)},
		{"oversized SEND", append((&msg{kind: msgRequest, op: opSend, length: maxSendPayload + 1}).encode(nil), make([]byte, maxSendPayload+1)...)},
		{"long query", append((&msg{kind: msgMRQuery}).encode(nil), 0)},
		{"unknown response", (&msg{kind: msgResponse, respKind: 9}).encode(nil)},
		{"error without status", (&msg{kind: msgResponse, respKind: respErr}).encode(nil)},
		{"RNR timer over 31", (&msg{kind: msgResponse, respKind: respRNR, rnrTimer: 32}).encode(nil)},
		{"huge region", (&msg{kind: msgRegion, ok: true, size: maxRegionSize + 1}).encode(nil)},
		{"wrapping region", (&msg{kind: msgRegion, ok: true, addr: ^uint64(0), size: 2}).encode(nil)},
		{"unknown access", (&msg{kind: msgRegion, ok: true, access: 8, size: 1}).encode(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m msg
			require.ErrorIs(t, m.decode(tt.b), errMalformed, "decode(%x)", tt.b)
		})
	}
}

// TestWireDecodeAllocs: decoding, on the data path of both sides, allocates nothing.
func TestWireDecodeAllocs(t *testing.T) {
	b := (&msg{kind: msgRequest, op: opWriteWithImm, length: 64}).encode(nil)
	var m msg
	allocs := testing.AllocsPerRun(100, func() { _ = m.decode(b) })
	require.Zero(t, allocs, "allocations per decode")
}

// FuzzDecode: no datagram makes decode panic, and what it accepts encodes to a datagram
// that decodes to the same message (reserved bytes aside, which decode ignores).
func FuzzDecode(f *testing.F) {
	for _, m := range []msg{
		{kind: msgHello, srcQPN: 1, dstQPN: 2},
		{kind: msgRequest, op: opSend, length: 2, payload: []byte("hi")},
		{kind: msgRequest, op: opWriteWithImm, length: 64, rkey: 1, addr: 4096},
		{kind: msgMRQuery, rkey: 1},
		{kind: msgResponse, respKind: respRNR, rnrTimer: 1},
		{kind: msgRegion, ok: true, rkey: 1, size: 4096, access: 7},
		{kind: msgDoorbell},
	} {
		f.Add(m.encode(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m msg
		if m.decode(b) != nil {
			return
		}
		enc := m.encode(nil)
		var again msg
		if err := again.decode(enc); err != nil {
			t.Fatalf("decode(encode(decode(%x))) = %v", b, err)
		}
		if !bytes.Equal(m.payload, again.payload) {
			t.Fatalf("payload %x came back as %x", m.payload, again.payload)
		}
		m.payload, again.payload = nil, nil
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("decode(%x) = %+v, but its encoding decodes to %+v", b, m, again)
		}
	})
}
