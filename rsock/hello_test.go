package rsock

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// sampleEndpoint is a valid RDMA endpoint with every field set.
var sampleEndpoint = rdmaEndpoint{
	GID:       verbs.GID{0: 0xfe, 1: 0x80, 15: 0x01},
	LID:       0x1234,
	MTU:       verbs.MTU4096,
	QPN:       0xabcdef,
	PSN:       0x123456,
	RingSize:  256 << 10,
	RecvWQEs:  64,
	MaxInline: 220,
	Nonce:     nonce{0: 0xa0, 7: 0x77, 15: 0x0f},

	UnitRingSize:   4 << 20,
	GrowRecvWQEsTo: 256,
}

// legacyEndpoint is sampleEndpoint as a hello from before the unit ring carries it
// (and with it the receive queue's growth).
var legacyEndpoint = func() rdmaEndpoint {
	e := sampleEndpoint
	e.UnitRingSize, e.GrowRecvWQEsTo = 0, 0
	return e
}()

// unitRingEndpoint is sampleEndpoint as a hello from before the receive queue's growth
// carries it: the unit ring's byte ends it.
var unitRingEndpoint = func() rdmaEndpoint {
	e := sampleEndpoint
	e.GrowRecvWQEsTo = 0
	return e
}()

func TestHelloRoundTrip(t *testing.T) {
	tests := []struct {
		h    hello
		size int
	}{
		{offerHello(nil), helloHeaderLen + helloCapsLen},
		{offerHello(&sampleEndpoint), helloHeaderLen + helloCapsLen + rdmaEndpointLen + unitRingLen + growWQEsLen},
		{acceptHello(sampleEndpoint), helloHeaderLen + helloCapsLen + rdmaEndpointLen + unitRingLen + growWQEsLen},
		{offerHello(&legacyEndpoint), helloHeaderLen + helloCapsLen + rdmaEndpointLen},
		{offerHello(&unitRingEndpoint), helloHeaderLen + helloCapsLen + rdmaEndpointLen + unitRingLen},
		{acceptHello(unitRingEndpoint), helloHeaderLen + helloCapsLen + rdmaEndpointLen + unitRingLen},
		{acceptHello(legacyEndpoint), helloHeaderLen + helloCapsLen + rdmaEndpointLen},
		{withCaps(offerHello(&sampleEndpoint), capPlace), helloHeaderLen + helloCapsLen + rdmaEndpointLen + unitRingLen + growWQEsLen},
		{withCaps(acceptHello(sampleEndpoint), capPlace|capSHM), helloHeaderLen + helloCapsLen + rdmaEndpointLen + unitRingLen + growWQEsLen},
		{declineHello(declineNoDevice), helloHeaderLen + 1},
		{declineHello(declineReason(250)), helloHeaderLen + 1},
	}
	for _, tt := range tests {
		b := tt.h.appendTo(nil)
		require.Len(t, b, tt.size, "len(encode(%+v))", tt.h)
		got, n, err := decodeHello(append(b, "trailing data"...))
		require.NoError(t, err, "decode(encode(%+v))", tt.h)
		require.Equal(t, len(b), n, "bytes taken by decode(encode(%+v))", tt.h)
		require.Equal(t, tt.h, got, "decode(encode(h))")
	}
}

// TestHelloWireBytes pins the encoding of an offer to the format in hello.go.
func TestHelloWireBytes(t *testing.T) {
	got := offerHello(&sampleEndpoint).appendTo(nil)
	want := []byte{
		0x89, 'R', 'S', 'K', 2, 1, 0, 61, // header: version 2, offer, 61-byte body
		0, 0, 0, 1, // capabilities: RDMA
		0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, // GID
		0x12, 0x34, // LID
		5, 18, // MTU 4096, ring 2^18
		0, 0xab, 0xcd, 0xef, // QPN
		0, 0x12, 0x34, 0x56, // PSN
		0, 0, 0, 64, // receive WQEs
		0, 0, 0, 220, // max inline
		0xa0, 0, 0, 0, 0, 0, 0, 0x77, 0, 0, 0, 0, 0, 0, 0, 0x0f, // nonce
		22,         // unit ring 2^22
		0, 0, 1, 0, // receive WQEs grow to 256
	}
	require.Equal(t, want, got)
	require.Equal(t, []byte{0x89, 'R', 'S', 'K', 2, 3, 0, 1, 2}, declineHello(declineNoDevice).appendTo(nil))
}

func TestHelloDecodeErrors(t *testing.T) {
	offer := offerHello(&sampleEndpoint).appendTo(nil)
	mutate := func(at int, v byte) []byte {
		b := bytes.Clone(offer)
		b[at] = v
		return b
	}
	const ep = helloHeaderLen + helloCapsLen // start of the RDMA endpoint
	tests := []struct {
		name string
		in   []byte
		err  error
		text string
	}{
		{"empty", nil, ErrBadHello, "truncated: 0 bytes, 8 more needed"},
		{"not magic", []byte("GET / HTTP/1.1\r\n"), ErrNotRsockPeer, `first bytes "GET " are not an rsock hello`},
		{"magic prefix only", []byte{0x89, 'R'}, ErrBadHello, "truncated"},
		{"wrong magic byte", []byte{0x89, 'R', 'S', 'X', 1, 1, 0, 4}, ErrNotRsockPeer, "not an rsock hello"},
		{"truncated header", offer[:7], ErrBadHello, "truncated: 7 bytes, 1 more needed"},
		{"truncated body", offer[:30], ErrBadHello, "truncated: 30 bytes, 39 more needed"},
		{"oversized", []byte{0x89, 'R', 'S', 'K', 1, 1, 0x01, 0xf9}, ErrBadHello, "body of 505 bytes exceeds the maximum of 504"},
		{"oversized other version", []byte{0x89, 'R', 'S', 'K', 9, 1, 0xff, 0xff}, ErrBadHello, "exceeds the maximum"},
		{"version 0", mutate(4, 0), ErrVersionMismatch, "peer speaks version 0, this side 2"},
		{"version 1", mutate(4, 1), ErrVersionMismatch, "peer speaks version 1"},
		{"version 3", mutate(4, 3), ErrVersionMismatch, "peer speaks version 3"},
		{"kind 0", mutate(5, 0), ErrBadHello, "unknown kind 0"},
		{"kind 4", mutate(5, 4), ErrBadHello, "unknown kind 4"},
		{"offer without caps", []byte{0x89, 'R', 'S', 'K', 2, 1, 0, 2, 0, 0}, ErrBadHello, "offer body of 2 bytes is shorter than 4"},
		{"rdma bit without endpoint", []byte{0x89, 'R', 'S', 'K', 2, 1, 0, 4, 0, 0, 0, 1}, ErrBadHello, "offer body of 4 bytes is shorter than 56"},
		{"accept without rdma", []byte{0x89, 'R', 'S', 'K', 2, 2, 0, 4, 0, 0, 0, 0}, ErrBadHello, "accept without an RDMA endpoint"},
		{"decline without reason", []byte{0x89, 'R', 'S', 'K', 2, 3, 0, 0}, ErrBadHello, "decline without a reason"},
		{"decline reason 0", []byte{0x89, 'R', 'S', 'K', 2, 3, 0, 1, 0}, ErrBadHello, "decline with reason 0"},
		{"mtu 0", mutate(ep+18, 0), ErrBadHello, "RDMA MTU code 0"},
		{"mtu 6", mutate(ep+18, 6), ErrBadHello, "RDMA MTU code 6"},
		{"ring too small", mutate(ep+19, 11), ErrBadHello, "ring size 2^11"},
		{"ring too large", mutate(ep+19, 31), ErrBadHello, "ring size 2^31"},
		{"qpn over 24 bits", mutate(ep+20, 1), ErrBadHello, "QPN 0x1abcdef"},
		{"psn over 24 bits", mutate(ep+24, 1), ErrBadHello, "PSN 0x1123456"},
		{"no wqes", func() []byte { b := bytes.Clone(offer); copy(b[ep+28:], []byte{0, 0, 0, 0}); return b }(), ErrBadHello, "no receive WQEs"},
		{"qpn 0", func() []byte { b := bytes.Clone(offer); copy(b[ep+20:], []byte{0, 0, 0, 0}); return b }(), ErrBadHello, "QPN 0x0"},
		{"unit ring below the ring", mutate(ep+rdmaEndpointLen, 17), ErrBadHello, "unit ring 2^17 is outside 2^18..2^30"},
		{"unit ring above 1 GiB", mutate(ep+rdmaEndpointLen, 31), ErrBadHello, "unit ring 2^31"},
		{"WQEs grow to fewer", func() []byte {
			b := bytes.Clone(offer)
			copy(b[ep+rdmaEndpointLen+unitRingLen:], []byte{0, 0, 0, 63})
			return b
		}(), ErrBadHello, "receive WQEs grow from 64 to 63"},
		{"WQEs grow past 32768", mutate(ep+rdmaEndpointLen+unitRingLen+1, 0x80), ErrBadHello, "receive WQEs grow from 64 to 8388864, want at most 32768"},
	}
	for _, tt := range tests {
		_, _, err := decodeHello(tt.in)
		require.ErrorIs(t, err, tt.err, "decodeHello(%s)", tt.name)
		require.ErrorContains(t, err, tt.text, "decodeHello(%s)", tt.name)
	}
}

// TestHelloOtherVersion checks what a decoder gives back for another version's hello:
// enough to skip it and, for a decline, its reason.
func TestHelloOtherVersion(t *testing.T) {
	b := withExtra(declineHello(declineMTUMismatch).appendTo(nil), []byte("v7 fields")...)
	b[4] = 7
	h, n, err := decodeHello(append(b, "data"...))
	require.ErrorIs(t, err, ErrVersionMismatch)
	require.Equal(t, len(b), n)
	require.Equal(t, hello{version: 7, kind: helloDecline, reason: declineMTUMismatch}, h)
}

func TestHelloReasons(t *testing.T) {
	for r := declineNoProvider; r <= declineFailed; r++ {
		require.Equal(t, r, declineReasonOf(&FallbackError{Err: r.err()}), "declineReasonOf(%v)", r.err())
		require.Equal(t, r, declineReasonOf(&FallbackError{Peer: true, Err: r.err()}), "declineReasonOf(peer %v)", r.err())
	}
	require.Equal(t, declineFailed, declineReasonOf(errors.New("something else")))
	require.ErrorIs(t, declineReason(0).err(), ErrUpgradeFailed)
	require.ErrorIs(t, declineReason(99).err(), ErrUpgradeFailed)
}

// timeoutErr is an I/O error that interrupts a read without ending it.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// stutterReader returns one byte per Read, with a timeout between every two reads.
type stutterReader struct {
	r    io.Reader
	tick bool
}

func (s *stutterReader) Read(p []byte) (int, error) {
	s.tick = !s.tick
	if s.tick {
		return 0, timeoutErr{}
	}
	return iotest.OneByteReader(s.r).Read(p)
}

// TestHelloReaderResumes reads a hello through timeouts, one byte at a time, and checks
// that the reader takes the hello's bytes and nothing of the data behind it.
func TestHelloReaderResumes(t *testing.T) {
	want := offerHello(&sampleEndpoint)
	src := bytes.NewReader(append(want.appendTo(nil), "data"...))
	r := &stutterReader{r: src}
	var hr helloReader
	var timeouts int
	for {
		h, err := hr.read(r)
		if errors.Is(err, timeoutErr{}) {
			timeouts++
			continue
		}
		require.NoError(t, err)
		require.Equal(t, want, h)
		break
	}
	require.Equal(t, helloHeaderLen+helloCapsLen+rdmaEndpointLen+unitRingLen+growWQEsLen, timeouts, "one timeout per byte")
	rest, _ := io.ReadAll(src)
	require.Equal(t, "data", string(rest))
}

func TestHelloReaderEOF(t *testing.T) {
	offer := offerHello(nil).appendTo(nil)
	tests := []struct {
		in   []byte
		errs []error
	}{
		{nil, []error{ErrNotRsockPeer, io.ErrUnexpectedEOF}},
		{offer[:3], []error{ErrBadHello, io.ErrUnexpectedEOF}},
		{offer[:len(offer)-1], []error{ErrBadHello, io.ErrUnexpectedEOF}},
		{[]byte("no"), []error{ErrNotRsockPeer}},
	}
	for _, tt := range tests {
		var hr helloReader
		_, err := hr.read(bytes.NewReader(tt.in))
		for _, want := range tt.errs {
			require.ErrorIs(t, err, want, "read(%q)", tt.in)
		}
		require.True(t, helloErrFinal(err), "read(%q) error %v is final", tt.in, err)
	}
	var hr helloReader
	h, err := hr.read(iotest.DataErrReader(bytes.NewReader(offer)))
	require.NoError(t, err, "a hello that ends with EOF")
	require.Equal(t, offerHello(nil), h)
}

// FuzzDecodeHello checks that the decoder never panics, never takes more bytes than it
// was given or than a hello may have, and that whatever it accepts encodes back to the
// bytes it took, up to ignored reserved bits and trailing body bytes.
func FuzzDecodeHello(f *testing.F) {
	for _, h := range []hello{
		offerHello(nil), offerHello(&sampleEndpoint), acceptHello(sampleEndpoint), offerHello(&legacyEndpoint), offerHello(&unitRingEndpoint),
		declineHello(declineNoProvider), declineHello(declineVersionMismatch),
	} {
		f.Add(h.appendTo(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := decodeHello(b)
		if err != nil {
			if !errors.Is(err, ErrBadHello) && !errors.Is(err, ErrNotRsockPeer) && !errors.Is(err, ErrVersionMismatch) {
				t.Fatalf("decodeHello(%x) = %v, an error of no known kind", b, err)
			}
			if errors.Is(err, ErrVersionMismatch) && (n < helloHeaderLen || n > len(b) || n > helloMaxLen) {
				t.Fatalf("decodeHello(%x) framed %d bytes of another version", b, n)
			}
			return
		}
		if n < helloHeaderLen || n > len(b) || n > helloMaxLen {
			t.Fatalf("decodeHello(%x) took %d bytes", b, n)
		}
		again, m, err := decodeHello(h.appendTo(nil))
		if err != nil || again != h {
			t.Fatalf("decodeHello(encode(%+v)) = %+v, %d, %v", h, again, m, err)
		}
		var hr helloReader
		got, err := hr.read(iotest.OneByteReader(bytes.NewReader(b)))
		if err != nil || got != h || hr.n != n {
			t.Fatalf("helloReader on %x = %+v after %d bytes, %v; decodeHello = %+v after %d", b, got, hr.n, err, h, n)
		}
	})
}

// FuzzServerHandshake feeds arbitrary bytes to a Listener's handshake, with and without
// plain clients allowed: it must never panic, and either fail or hand over a connection
// whose first bytes, read back, are what followed the hello (or everything, for a
// plain client).
func FuzzServerHandshake(f *testing.F) {
	f.Add(offerHello(nil).appendTo(nil), false)
	f.Add(append(offerHello(&sampleEndpoint).appendTo(nil), "data"...), false)
	f.Add(append(offerHello(nil).appendTo(nil), "data"...), true)
	f.Add([]byte("GET / HTTP/1.0\r\n\r\n"), true)
	f.Add(withExtra(append(offerHello(nil).appendTo(nil)[:4], 2, 1, 0, 0), 1, 2, 3), false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	f.Fuzz(func(t *testing.T, in []byte, plain bool) {
		cfg, err := (&Config{AcceptPlainClients: plain, HandshakeTimeout: time.Second, PlainSniffTimeout: 10 * time.Millisecond}).resolve()
		if err != nil {
			t.Fatal(err)
		}
		l := &Listener{cfg: cfg, ctx: context.Background()}
		client, server := tcpPair(t, ln)
		done := make(chan struct{})
		defer client.Close()
		defer func() { <-done }()
		defer server.Close()
		go func() {
			defer close(done)
			client.Write(in)
			client.CloseWrite()
			io.Copy(io.Discard, client)
		}()
		c, err := l.handshake(server, TransportTCP)
		if err != nil {
			return
		}
		rest, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("handshake(%x): reading the data behind the hello: %v", in, err)
		}
		if errors.Is(c.FallbackReason(), ErrPlainClient) {
			if !bytes.Equal(rest, in) {
				t.Fatalf("plain client sent %x, server read %x", in, rest)
			}
			return
		}
		_, n, _ := decodeHello(in)
		if !bytes.Equal(rest, in[n:]) {
			t.Fatalf("client sent %x, server read %x behind a %d-byte hello", in, rest, n)
		}
	})
}

// tcpPair returns the two ends of a loopback TCP connection through ln. Both ends
// close with a reset, so that many pairs leave no sockets in TIME_WAIT.
func tcpPair(t *testing.T, ln net.Listener) (client, server *net.TCPConn) {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	client, server = c.(*net.TCPConn), s.(*net.TCPConn)
	client.SetLinger(0)
	server.SetLinger(0)
	return client, server
}

// withCaps returns h with the capability bits caps added.
func withCaps(h hello, caps helloCaps) hello {
	h.caps |= caps
	return h
}

// TestHelloPlaceWithoutRDMA: capPlace qualifies an RDMA endpoint, like capSHM: an
// offer that has no endpoint has no capabilities.
func TestHelloPlaceWithoutRDMA(t *testing.T) {
	b := withCaps(offerHello(nil), capPlace).appendTo(nil)
	got, _, err := decodeHello(b)
	require.NoError(t, err)
	require.Zero(t, got.caps)
	require.False(t, got.offersRDMA())
}
