package rsock

import (
	"bytes"
	"crypto/tls"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/testcert"
)

// TestTLSOverConnDefaultProvider wraps a TCP-bootstrapped rsock Conn pair in the
// application's own crypto/tls, on the default provider: over the device where the
// build and the machine have one for loopback (the VM harness's rxe: plaintext "rdma"
// underneath, TLS above), over TCP elsewhere. A stream goes both ways, each followed by
// a half-close, and arrives whole. internal/e2e's TLS tests do the same, with HTTPS and
// gRPC, on soft RDMA, TCP and QUIC.
func TestTLSOverConnDefaultProvider(t *testing.T) {
	scfg, ccfg := configs(t, FallbackTCP)
	ln := listen(t, scfg)
	c, s := pipe(t, ln, ccfg)
	want := TransportRDMA
	if _, err := defaultProvider(); err != nil {
		want = TransportTCP
	}
	require.Equal(t, want, c.Transport(), "client: %v", c.FallbackReason())
	require.Equal(t, want, s.Transport(), "server: %v", s.FallbackReason())

	st, ct, err := testcert.Configs()
	require.NoError(t, err)
	ct = ct.Clone()
	ct.ServerName = "localhost"
	tc, ts := tls.Client(c, ct), tls.Server(s, st)
	defer tc.Close()
	defer ts.Close()
	exchangeHalfClose(t, tc, ts, bytes.Repeat([]byte("tls up "), 100000), bytes.Repeat([]byte("tls down "), 100000))
	require.Equal(t, uint16(tls.VersionTLS13), tc.ConnectionState().Version)
}
