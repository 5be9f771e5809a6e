package rsock

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// sampleProof is a valid client proof with every field set.
var sampleProof = proof{
	role:     roleClient,
	client:   nonce{0: 0xc1, 15: 0xc2},
	server:   nonce{0: 0x51, 15: 0x52},
	ringRKey: 0xcafe_f00d,
	ringAddr: 0x7f00_dead_beef_0000,
}

// TestProofWireBytes pins the encoding to the format in proof.go.
func TestProofWireBytes(t *testing.T) {
	want := []byte{
		0x89, 'R', 'P', 'C', // magic, role
		0xc1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc2, // client nonce
		0x51, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x52, // server nonce
		0xca, 0xfe, 0xf0, 0x0d, // rkey
		0x7f, 0x00, 0xde, 0xad, 0xbe, 0xef, 0, 0, // ring address
	}
	got := sampleProof.appendTo(nil)
	require.Equal(t, want, got)
	require.Len(t, got, proofLen)
	back, err := decodeProof(got)
	require.NoError(t, err)
	require.Equal(t, sampleProof, back)
}

func TestProofDecodeErrors(t *testing.T) {
	good := sampleProof.appendTo(nil)
	mutate := func(at int, v byte) []byte {
		b := bytes.Clone(good)
		b[at] = v
		return b
	}
	tests := []struct {
		name string
		in   []byte
		text string
	}{
		{"empty", nil, "proof of 0 bytes, want 48"},
		{"short", good[:47], "proof of 47 bytes"},
		{"long", append(bytes.Clone(good), 0), "proof of 49 bytes"},
		{"magic", mutate(0, 0x88), "not the proof magic"},
		{"hello magic", append([]byte{0x89, 'R', 'S', 'K'}, good[4:]...), "not the proof magic"},
		{"role", mutate(3, 'X'), "proof role 0x58"},
	}
	for _, tt := range tests {
		_, err := decodeProof(tt.in)
		require.ErrorIs(t, err, ErrPathUnproven, "decodeProof(%s)", tt.name)
		require.ErrorContains(t, err, tt.text, "decodeProof(%s)", tt.name)
	}
}

// TestProofBinds: a proof binds only in its own role and with both of this
// connection's nonces.
func TestProofBinds(t *testing.T) {
	other := nonce{1}
	tests := []struct {
		name           string
		role           byte
		client, server nonce
		text           string // "" binds
	}{
		{"binds", roleClient, sampleProof.client, sampleProof.server, ""},
		{"reflected", roleServer, sampleProof.client, sampleProof.server, `a proof in role 'C' where 'S''s belongs`},
		{"other client nonce", roleClient, other, sampleProof.server, "another bootstrap connection"},
		{"other server nonce", roleClient, sampleProof.client, other, "another bootstrap connection"},
	}
	for _, tt := range tests {
		err := sampleProof.binds(tt.role, tt.client, tt.server)
		if tt.text == "" {
			require.NoError(t, err, tt.name)
			continue
		}
		require.ErrorIs(t, err, ErrPathUnproven, tt.name)
		require.ErrorContains(t, err, tt.text, tt.name)
	}
}

func TestNewNonce(t *testing.T) {
	a, b := newNonce(), newNonce()
	require.NotEqual(t, a, b, "two fresh nonces")
	require.NotEqual(t, nonce{}, a)
}

// FuzzDecodeProof checks that the decoder never panics, fails only with
// ErrPathUnproven, and that whatever it accepts encodes back to the same bytes.
func FuzzDecodeProof(f *testing.F) {
	f.Add(sampleProof.appendTo(nil))
	s := sampleProof
	s.role = roleServer
	f.Add(s.appendTo(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeProof(b)
		if err != nil {
			if !errors.Is(err, ErrPathUnproven) {
				t.Fatalf("decodeProof(%x) = %v, an error of no known kind", b, err)
			}
			return
		}
		if again := p.appendTo(nil); !bytes.Equal(again, b) {
			t.Fatalf("decodeProof(%x) = %+v, which encodes to %x", b, p, again)
		}
	})
}
