package e2e

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/internal/harness"
	"github.com/rsockio/rsock/internal/testcert"
)

// The tests in this file run crypto/tls, unmodified, over rsock connections: a Conn is
// a net.Conn on every transport, so tls.Client and tls.Server wrap it as they wrap TCP.

// tlsConfigs returns the test certificate's server configuration and a client
// configuration that verifies it by name.
func tlsConfigs(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	server, client, err := testcert.Configs()
	require.NoError(t, err)
	client.ServerName = "localhost"
	return server, client
}

// TestTLSOverRsockStream sends a large stream each way through tls.Client and
// tls.Server wrapping an rsock connection, both at once, each ended with TLS's
// close_notify, and checks the digests.
func TestTLSOverRsockStream(t *testing.T) {
	const size = 4 << 20
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		st, ct := tlsConfigs(t)
		ln := env.Listen(t)
		type side struct {
			sum string
			err error
		}
		server := make(chan side, 1)
		go func() {
			raw, err := ln.Accept()
			if err != nil {
				server <- side{err: err}
				return
			}
			tc := tls.Server(raw, st)
			defer tc.Close()
			sum, err := hashBothWays(tc, 2, size)
			server <- side{sum, err}
		}()
		raw, err := env.Dialer().DialContext(ctx, "tcp", ln.Addr().String())
		require.NoError(t, err)
		tc := tls.Client(raw, ct)
		defer tc.Close()
		require.NoError(t, tc.HandshakeContext(ctx))
		require.True(t, tc.ConnectionState().HandshakeComplete)
		got, err := hashBothWays(tc, 1, size)
		require.NoError(t, err)
		require.Equal(t, digest(2, size), got, "the client's digest of the server's stream")
		s := <-server
		require.NoError(t, s.err)
		require.Equal(t, digest(1, size), s.sum, "the server's digest of the client's stream")
		harness.RequireTransport(t, env.Want, ln.Conns(), 1, "server")
	})
}

// hashBothWays writes size bytes of payload seed to c and closes its writing side,
// while it reads c to the end; it returns the digest of what it read.
func hashBothWays(c *tls.Conn, seed uint64, size int64) (string, error) {
	wrote := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, harness.Payload(seed, size))
		if err == nil {
			err = c.CloseWrite()
		}
		wrote <- err
	}()
	h := sha256.New()
	_, rerr := io.Copy(h, c)
	if werr := <-wrote; werr != nil {
		return "", fmt.Errorf("write: %w", werr)
	}
	if rerr != nil {
		return "", fmt.Errorf("read: %w", rerr)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// digest is the digest hashBothWays returns for a peer that sent payload seed.
func digest(seed uint64, size int64) string {
	h := sha256.New()
	io.Copy(h, harness.Payload(seed, size))
	return hex.EncodeToString(h.Sum(nil))
}

// TestHTTPSOverRsock serves HTTPS (net/http's ServeTLS, HTTP/2 negotiated by ALPN) on an
// rsock Listener to an http.Client dialing with an rsock Dialer, and uploads and
// downloads a body checked by digest.
func TestHTTPSOverRsock(t *testing.T) {
	const size = 1 << 20
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		st, ct := tlsConfigs(t)
		ln := env.Listen(t)
		srv := &http.Server{
			TLSConfig: st,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.TLS == nil {
					http.Error(w, "not over TLS", http.StatusBadRequest)
					return
				}
				h := sha256.New()
				if _, err := io.Copy(h, r.Body); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				w.Header().Set("X-Upload-SHA256", hex.EncodeToString(h.Sum(nil)))
				w.Header().Set("X-Proto", r.Proto)
				io.Copy(w, harness.Payload(2, size))
			}),
		}
		served := make(chan error, 1)
		go func() { served <- srv.ServeTLS(ln, "", "") }()
		defer func() {
			require.NoError(t, srv.Shutdown(harness.Context(t)))
			require.ErrorIs(t, <-served, http.ErrServerClosed)
		}()

		tr := &http.Transport{DialContext: env.Dialer().DialContext, TLSClientConfig: ct, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr}
		url := "https://" + ln.Addr().String() + "/"
		for range 2 { // the second request reuses the connection
			resp, err := c.Post(url, "application/octet-stream", harness.Payload(1, size))
			require.NoError(t, err)
			h := sha256.New()
			_, err = io.Copy(h, resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NotNil(t, resp.TLS)
			require.Equal(t, "HTTP/2.0", resp.Header.Get("X-Proto"))
			require.Equal(t, digest(1, size), resp.Header.Get("X-Upload-SHA256"))
			require.Equal(t, digest(2, size), hex.EncodeToString(h.Sum(nil)))
		}
		harness.RequireTransport(t, env.Want, ln.Conns(), 1, "server")
	})
}

// TestGRPCWithTLSOverRsock makes gRPC calls with TLS transport credentials, through an
// rsock Dialer to a grpc.Server on an rsock Listener.
func TestGRPCWithTLSOverRsock(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		st, ct := tlsConfigs(t)
		ln := env.Listen(t)
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(st)))
		echosvc.Register(srv, echosvc.Service{})
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		defer func() {
			srv.Stop()
			require.NoError(t, <-served)
		}()
		d := env.Dialer()
		cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
			grpc.WithContextDialer(d.DialAddr),
			grpc.WithTransportCredentials(credentials.NewTLS(ct)))
		require.NoError(t, err)
		defer cc.Close()
		c := echosvc.NewClient(cc)
		for _, size := range []int{0, 100, 64 << 10, 1 << 20} {
			in := echosvc.Fill(size, size)
			var p peer.Peer
			out, err := c.Echo(ctx, in, grpc.Peer(&p))
			require.NoError(t, err, "Echo(%d bytes)", size)
			require.True(t, bytes.Equal(in, out), "Echo(%d bytes) returned %d different bytes", size, len(out))
			info, ok := p.AuthInfo.(credentials.TLSInfo)
			require.True(t, ok, "the call's auth info is %T, not TLS", p.AuthInfo)
			require.True(t, info.State.HandshakeComplete)
		}
		harness.RequireTransport(t, env.Want, ln.Conns(), 1, "server")
		harness.RequireTransport(t, env.Want, d.Conns(), 1, "client")
	})
}
