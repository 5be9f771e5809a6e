package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/examples/internal/examplecert"
	"github.com/rsockio/rsock/examples/internal/exampletest"
	"github.com/rsockio/rsock/rsock"
)

func TestMain(m *testing.M) {
	exampletest.VerifyTestMain(m)
}

func TestServe(t *testing.T) {
	exampletest.ForEachTransport(t, func(t *testing.T, tr exampletest.Transport, ln *rsock.Listener) {
		srv := exampletest.Serve(t, func(ctx context.Context, logger *log.Logger) error {
			return serve(ctx, ln, logger)
		})

		c, err := rsock.Dial("tcp", ln.Addr().String(), tr.Config)
		require.NoError(t, err)
		defer c.Close()
		msg := bytes.Repeat([]byte("echo "), 100_000)
		go func() {
			c.Write(msg)
			c.CloseWrite()
		}()
		got, err := io.ReadAll(c)
		require.NoError(t, err)
		require.Equal(t, msg, got)

		// A second client, still connected when the server stops.
		c2, err := rsock.Dial("tcp", ln.Addr().String(), tr.Config)
		require.NoError(t, err)
		defer c2.Close()
		_, err = c2.Write([]byte("x"))
		require.NoError(t, err)
		_, err = io.ReadFull(c2, make([]byte, 1))
		require.NoError(t, err)

		srv.Stop()
		require.NoError(t, srv.Wait())
		_, err = c2.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "the server closes open connections when it stops")
		require.Contains(t, srv.Logs(), tr.Pick("connected over rdma\n", "connected over tcp (not rdma: rsock: upgrade to rdma: peer offered no RDMA)\n"))
		require.Contains(t, srv.Logs(), "echoed 500000 bytes")
	})
}

// TestConfig: without -quic the server keeps the defaults and logs to slog.Default;
// with -quic it makes a self-signed certificate (once), serves QUIC with it, and a
// client that trusts the certificate file echoes over QUIC.
func TestConfig(t *testing.T) {
	var logs exampletest.Log
	cfg, err := config("127.0.0.1:0", false, "", "", logs.Logger())
	require.NoError(t, err)
	require.Equal(t, rsock.FallbackTCP, cfg.Fallback)
	require.Same(t, slog.Default(), cfg.Logger, "the server logs rsock's reports")

	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	cfg, err = config("127.0.0.1:0", true, certFile, keyFile, logs.Logger())
	require.NoError(t, err)
	require.Equal(t, rsock.FallbackQUIC, cfg.Fallback)
	require.Contains(t, logs.String(), "made a self-signed certificate for 127.0.0.1 in "+certFile)
	_, err = config("127.0.0.1:0", true, certFile, keyFile, logs.Logger())
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(logs.String(), "made a self-signed"), "the second start loads the certificate")
	_, err = config("no port", true, certFile, keyFile, logs.Logger())
	require.Error(t, err)

	cfg.DisableRDMA = true // the fallback under test, even on a machine with RDMA
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	srv := exampletest.Serve(t, func(ctx context.Context, logger *log.Logger) error {
		return serve(ctx, ln, logger)
	})
	ctls, err := examplecert.ClientConfig(certFile)
	require.NoError(t, err)
	c, err := rsock.Dial("tcp", ln.Addr().String(), &rsock.Config{Fallback: rsock.FallbackQUIC, TLSConfig: ctls, DisableRDMA: true})
	require.NoError(t, err)
	require.Equal(t, rsock.TransportQUIC, c.Transport())
	_, err = c.Write([]byte("over quic"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "over quic", string(got))
	c.Close()
	srv.Stop()
	require.NoError(t, srv.Wait())
	require.Contains(t, srv.Logs(), "connected over quic")
}
