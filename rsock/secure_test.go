package rsock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/verbs/soft"
)

// wireTap records every payload that crosses a soft fabric.
type wireTap struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func tapFabric(fab *soft.Fabric) *wireTap {
	w := &wireTap{}
	fab.SetTap(func(ev soft.TapEvent) {
		w.mu.Lock()
		w.buf.Write(ev.Payload)
		w.mu.Unlock()
	})
	return w
}

// contains reports whether marker crossed the fabric in one piece.
func (w *wireTap) contains(marker []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Contains(w.buf.Bytes(), marker)
}

func (w *wireTap) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Len()
}

// TestNoSilentPlaintext watches the soft fabric while a pair exchanges a recognizable
// stream both ways: under a QUIC bootstrap the application's bytes never cross it in
// plaintext unless both sides allow it, and the Conn says which it got.
func TestNoSilentPlaintext(t *testing.T) {
	tests := []struct {
		name                    string
		fallback                Fallback
		clientAllows, srvAllows bool
		want                    string
		plaintextOnWireExpected bool
	}{
		{"quic default", FallbackQUIC, false, false, TransportRDMATLS, false},
		{"quic only the client allows plaintext", FallbackQUIC, true, false, TransportRDMATLS, false},
		{"quic only the server allows plaintext", FallbackQUIC, false, true, TransportRDMATLS, false},
		{"quic both allow plaintext", FallbackQUIC, true, true, TransportRDMA, true},
		{"tcp bootstrap is plaintext", FallbackTCP, false, false, TransportRDMA, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			wire := tapFabric(fab)
			scfg, ccfg := configs(t, tc.fallback)
			scfg.Provider, ccfg.Provider = fab, fab
			scfg.AllowPlaintextRDMA, ccfg.AllowPlaintextRDMA = tc.srvAllows, tc.clientAllows
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			require.Equal(t, tc.want, c.Transport(), "client: %v", c.FallbackReason())
			require.Equal(t, tc.want, s.Transport(), "server: %v", s.FallbackReason())
			require.NoError(t, c.FallbackReason())
			require.NoError(t, s.FallbackReason())

			up := bytes.Repeat([]byte("client secret: the quick brown fox. "), 2000)
			down := bytes.Repeat([]byte("server secret: jumps over the lazy dog. "), 2000)
			exchangeHalfClose(t, c, s, up, down)
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
			require.NotZero(t, wire.len(), "nothing crossed the fabric: the test watches the wrong place")
			for _, m := range [][]byte{up[:32], down[:32]} {
				require.Equal(t, tc.plaintextOnWireExpected, wire.contains(m), "plaintext %q on the wire", m)
			}
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

// exchangeHalfClose sends up from c to s and down from s to c at the same time, each followed by
// a half-close, and checks both arrive whole.
func exchangeHalfClose(t *testing.T, c, s net.Conn, up, down []byte) {
	t.Helper()
	type result struct {
		got []byte
		err error
	}
	send := func(w net.Conn, p []byte, done chan<- error) {
		_, err := w.Write(p)
		if err == nil {
			err = w.(interface{ CloseWrite() error }).CloseWrite()
		}
		done <- err
	}
	recv := func(r net.Conn, out chan<- result) {
		got, err := io.ReadAll(r)
		out <- result{got, err}
	}
	sent := make(chan error, 2)
	atServer, atClient := make(chan result, 1), make(chan result, 1)
	go send(c, up, sent)
	go send(s, down, sent)
	go recv(s, atServer)
	go recv(c, atClient)
	require.NoError(t, <-sent)
	require.NoError(t, <-sent)
	r := <-atServer
	require.NoError(t, r.err)
	require.Equal(t, sha256.Sum256(up), sha256.Sum256(r.got))
	r = <-atClient
	require.NoError(t, r.err)
	require.Equal(t, sha256.Sum256(down), sha256.Sum256(r.got))
}

// pipeStream is one end of a net.Pipe as a Conn's stream.
type pipeStream struct{ net.Conn }

func (pipeStream) CloseWrite() error { return errors.New("no half-close on a pipe") }

// TestSecureModeExchange runs one side of the mode exchange against a scripted peer:
// the peer's byte can force TLS but never plaintext on a side that requires TLS, and a
// byte rsock does not send fails the connection.
func TestSecureModeExchange(t *testing.T) {
	stls, ctls, err := testcert.Configs()
	require.NoError(t, err)
	ctls.ServerName = "localhost"
	tests := []struct {
		name     string
		allow    bool
		peerByte byte
		want     string // the transport, or "" for an error
		wantErr  error
	}{
		{"requires tls, peer says plain", false, modePlain, TransportRDMATLS, nil},
		{"requires tls, peer says tls", false, modeTLS, TransportRDMATLS, nil},
		{"allows plain, peer says tls", true, modeTLS, TransportRDMATLS, nil},
		{"allows plain, peer says plain", true, modePlain, TransportRDMA, nil},
		{"garbage mode byte", false, 'X', "", errBadMode},
		{"garbage mode byte, plaintext allowed", true, 0, "", errBadMode},
	}
	for _, tc := range tests {
		for _, client := range []bool{true, false} {
			name := tc.name + map[bool]string{true: " (client)", false: " (server)"}[client]
			t.Run(name, func(t *testing.T) {
				a, b := net.Pipe()
				defer a.Close()
				defer b.Close()
				cfg := &Config{Fallback: FallbackQUIC, TLSConfig: stls, AllowPlaintextRDMA: tc.allow}
				if client {
					cfg.TLSConfig = ctls
				}
				c := &Conn{s: pipeStream{a}, local: a.LocalAddr(), remote: a.RemoteAddr(), transport: TransportRDMA}
				peerDone := make(chan error, 1)
				go func() {
					var mine [1]byte
					if _, err := io.ReadFull(b, mine[:]); err != nil {
						peerDone <- err
						return
					}
					if _, err := b.Write([]byte{tc.peerByte}); err != nil {
						peerDone <- err
						return
					}
					if tc.want != TransportRDMATLS {
						peerDone <- nil
						return
					}
					var tc2 *tls.Conn
					if client {
						tc2 = tls.Server(b, dataTLSConfig(stls, true))
					} else {
						tc2 = tls.Client(b, dataTLSConfig(ctls, false))
					}
					if err := tc2.Handshake(); err != nil {
						peerDone <- err
						return
					}
					_, err := tc2.Write([]byte("over tls"))
					peerDone <- err
				}()
				err := secure(context.Background(), c, cfg, client)
				if tc.wantErr != nil {
					require.ErrorIs(t, err, tc.wantErr)
					require.NoError(t, <-peerDone)
					return
				}
				require.NoError(t, err)
				require.Equal(t, tc.want, c.Transport())
				if tc.want == TransportRDMATLS {
					buf := make([]byte, 8)
					_, err := io.ReadFull(c, buf)
					require.NoError(t, err)
					require.Equal(t, "over tls", string(buf))
				}
				require.NoError(t, <-peerDone)
			})
		}
	}
}

// TestSecureCancelled checks that the exchange ends with the context: a peer that
// stalls inside the TLS handshake does not hold the connection's setup.
func TestSecureCancelled(t *testing.T) {
	_, ctls, err := testcert.Configs()
	require.NoError(t, err)
	ctls.ServerName = "localhost"
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		var mode [1]byte
		io.ReadFull(b, mode[:])
		b.Write([]byte{modeTLS})
		io.ReadFull(b, make([]byte, 5)) // the ClientHello's record header has arrived
		cancel()
		io.Copy(io.Discard, b)
	}()
	c := &Conn{s: pipeStream{a}, local: a.LocalAddr(), remote: a.RemoteAddr(), transport: TransportRDMA}
	err = secure(ctx, c, &Config{Fallback: FallbackQUIC, TLSConfig: ctls}, true)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, TransportRDMA, c.Transport(), "a failed exchange must not report TLS")
}

// TestSecureConcurrentClose closes an encrypted RDMA connection from two goroutines at
// once, as net/http does: both Closes return only once the RDMA resources are released.
func TestSecureConcurrentClose(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := configs(t, FallbackQUIC)
	scfg.Provider, ccfg.Provider = fab, fab
	ln := listen(t, scfg)
	for range 10 {
		c, s := pipe(t, ln, ccfg)
		require.Equal(t, TransportRDMATLS, c.Transport())
		require.NoError(t, s.Close())
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { c.Close() })
		}
		wg.Wait()
		requireReleased(t, fab)
	}
}

// TestSecureDefaultProvider runs a QUIC-configured pair on the default provider: where
// the build and the machine have an RDMA device for loopback (the VM harness's rxe), it
// gets "rdma+tls" and moves a stream both ways; elsewhere it stays on QUIC and says why.
func TestSecureDefaultProvider(t *testing.T) {
	scfg, ccfg := configs(t, FallbackQUIC)
	ln := listen(t, scfg)
	c, s := pipe(t, ln, ccfg)
	defer c.Close()
	defer s.Close()
	want := TransportRDMATLS
	if _, err := defaultProvider(); err != nil {
		want = TransportQUIC
		require.ErrorIs(t, c.FallbackReason(), ErrNoProvider)
	}
	require.Equal(t, want, c.Transport(), "client: %v", c.FallbackReason())
	require.Equal(t, want, s.Transport(), "server: %v", s.FallbackReason())
	exchangeHalfClose(t, c, s, bytes.Repeat([]byte("up "), 100000), bytes.Repeat([]byte("down "), 100000))
}
