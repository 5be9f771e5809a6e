package rsock

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"
)

func TestConnNettest(t *testing.T) {
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			scfg, ccfg := configs(t, f)
			// Over a device (the default provider, as in the VM) a QUIC bootstrap upgrades
			// to RDMA with TLS, whose write deadlines are crypto/tls's: after a Write times
			// out the connection is unusable, which nettest's timeout tests reject (see
			// "Limitations" in the package docs). This test is about rsock's own Conn on
			// each transport; the encrypted stream is tested in secure_test.go and
			// internal/e2e's TLS tests.
			scfg.AllowPlaintextRDMA, ccfg.AllowPlaintextRDMA = true, true
			ln := listen(t, scfg)
			// c1 is the connection nettest drives; run it as the client and as the
			// server, since only the client reads the server's hello lazily.
			for _, side := range []string{"Client", "Server"} {
				t.Run(side, func(t *testing.T) {
					nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
						c, s := pipe(t, ln, ccfg)
						stop = func() { c.Close(); s.Close() }
						if side == "Server" {
							return s, c, stop, nil
						}
						return c, s, stop, nil
					})
				})
			}
		})
	}
}

func TestTransportAndFallbackReason(t *testing.T) {
	// The configurations are explicit (RDMA disabled, or a provider without devices):
	// with the default provider, a build with -tags rdma on a machine with a device
	// would upgrade.
	tests := []struct {
		fallback   Fallback
		provider   bool // a provider without devices; else RDMA disabled
		transport  string
		clientWhy  error
		clientText string
	}{
		{FallbackTCP, false, TransportTCP, ErrNoProvider, "rsock: upgrade to rdma: no RDMA provider: RDMA disabled by Config.DisableRDMA"},
		{FallbackTCP, true, TransportTCP, ErrNoDevice, "rsock: upgrade to rdma: no RDMA device: provider fake: "},
		{FallbackQUIC, false, TransportQUIC, ErrNoProvider, "rsock: upgrade to rdma: no RDMA provider: RDMA disabled by Config.DisableRDMA"},
		{FallbackQUIC, true, TransportQUIC, ErrNoDevice, "rsock: upgrade to rdma: no RDMA device: provider fake: "},
	}
	for _, tt := range tests {
		scfg, ccfg := configs(t, tt.fallback)
		if tt.provider {
			scfg.Provider, ccfg.Provider = fakeProvider{}, fakeProvider{}
		} else {
			scfg.DisableRDMA, ccfg.DisableRDMA = true, true
		}
		ln := listen(t, scfg)
		c, s := pipe(t, ln, ccfg)

		require.Equal(t, tt.transport, c.Transport(), "client transport, %v provider=%v", tt.fallback, tt.provider)
		require.Equal(t, tt.transport, s.Transport(), "server transport, %v provider=%v", tt.fallback, tt.provider)
		var fe *FallbackError
		require.ErrorAs(t, c.FallbackReason(), &fe)
		require.ErrorIs(t, c.FallbackReason(), tt.clientWhy)
		require.True(t, strings.HasPrefix(c.FallbackReason().Error(), tt.clientText), "client's reason %q, want prefix %q", c.FallbackReason(), tt.clientText)
		require.ErrorIs(t, s.FallbackReason(), ErrPeerOfferedNone, "server's reason")
		require.EqualError(t, s.FallbackReason(), "rsock: upgrade to rdma: peer offered no RDMA")

		// The connection works both ways.
		_, err := c.Write([]byte("ping"))
		require.NoError(t, err)
		b := make([]byte, 4)
		_, err = io.ReadFull(s, b)
		require.NoError(t, err)
		_, err = s.Write([]byte("pong"))
		require.NoError(t, err)
		_, err = io.ReadFull(c, b)
		require.NoError(t, err)
		require.Equal(t, "pong", string(b))
		c.Close()
		s.Close()
		ln.Close()
	}
}

func TestFallbackErrorText(t *testing.T) {
	tests := []struct {
		err  *FallbackError
		text string
		is   []error
	}{
		{&FallbackError{Peer: true, Err: ErrNoDevice}, "rsock: upgrade to rdma: peer declined: no RDMA device", []error{ErrPeerDeclined, ErrNoDevice}},
		{&FallbackError{Err: ErrMTUMismatch}, "rsock: upgrade to rdma: RDMA path MTU mismatch", []error{ErrMTUMismatch}},
		{&FallbackError{Peer: true, Err: declineReason(200).err()}, "rsock: upgrade to rdma: peer declined: rdma upgrade failed (reason 200)", []error{ErrPeerDeclined, ErrUpgradeFailed}},
	}
	for _, tt := range tests {
		require.EqualError(t, tt.err, tt.text)
		for _, want := range tt.is {
			require.ErrorIs(t, tt.err, want, "errors.Is(%q, %v)", tt.err, want)
		}
	}
	require.NotErrorIs(t, &FallbackError{Err: ErrNoDevice}, ErrPeerDeclined)
}

func TestCloseWrite(t *testing.T) {
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			scfg, ccfg := configs(t, f)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			defer c.Close()
			defer s.Close()

			// The client sends a request and half-closes; the server reads it to EOF,
			// answers and closes; the client reads the whole answer.
			served := make(chan error, 1)
			go func() {
				req, err := io.ReadAll(s)
				if err == nil {
					_, err = s.Write(bytes.ToUpper(req))
				}
				s.Close()
				served <- err
			}()
			_, err := c.Write([]byte("request"))
			require.NoError(t, err)
			require.NoError(t, c.CloseWrite())
			resp, err := io.ReadAll(c)
			require.NoError(t, err)
			require.Equal(t, "REQUEST", string(resp))
			require.NoError(t, <-served, "server side")
			_, err = c.Write([]byte("x"))
			require.Error(t, err, "Write after CloseWrite")
		})
	}
}

// TestCopy checks io.Copy to and from a Conn in both directions, on each transport.
// Over TCP the copy goes through the net.TCPConn's ReadFrom and WriteTo.
func TestCopy(t *testing.T) {
	payload := bytes.Repeat([]byte("rsock copies "), 100_000)
	src := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.WriteFile(src, payload, 0o600))
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			scfg, ccfg := configs(t, f)
			// The fallback's own data path (sendfile and splice on TCP), even on a
			// machine with an RDMA device.
			scfg.DisableRDMA, ccfg.DisableRDMA = true, true
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			defer c.Close()
			defer s.Close()

			sent := make(chan error, 1)
			go func() {
				file, err := os.Open(src)
				if err != nil {
					sent <- err
					return
				}
				defer file.Close()
				_, err = io.Copy(s, file) // Conn.ReadFrom(*os.File): sendfile on TCP
				sent <- errors.Join(err, s.CloseWrite())
			}()
			dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
			require.NoError(t, err)
			defer dst.Close()
			n, err := io.Copy(dst, c) // Conn.WriteTo(*os.File), after the lazy hello
			require.NoError(t, err)
			require.NoError(t, <-sent)
			require.Equal(t, int64(len(payload)), n)
			got, err := os.ReadFile(dst.Name())
			require.NoError(t, err)
			require.True(t, bytes.Equal(payload, got), "copied file differs")

			_, isTCP := c.s.(*net.TCPConn)
			require.Equal(t, f == FallbackTCP, isTCP, "TCP data path is the net.TCPConn itself")
		})
	}
}

func TestHTTP(t *testing.T) {
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			scfg, ccfg := configs(t, f)
			ln := listen(t, scfg)
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte("hello over " + r.URL.Path))
			})}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()

			tr := &http.Transport{DialContext: (&Dialer{Config: ccfg}).DialContext}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			for range 3 {
				resp, err := client.Get("http://" + ln.Addr().String() + "/" + f.String())
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err)
				require.Equal(t, "hello over /"+f.String(), string(body))
			}
			tr.CloseIdleConnections()
			require.NoError(t, srv.Shutdown(context.Background()))
			require.ErrorIs(t, <-served, http.ErrServerClosed)
		})
	}
}
