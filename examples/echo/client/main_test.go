package main

import (
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/examples/internal/examplecert"
	"github.com/rsockio/rsock/examples/internal/exampletest"
	"github.com/rsockio/rsock/rsock"
)

func TestMain(m *testing.M) {
	exampletest.VerifyTestMain(m)
}

func TestRun(t *testing.T) {
	exampletest.ForEachTransport(t, func(t *testing.T, tr exampletest.Transport, ln *rsock.Listener) {
		defer ln.Close()
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { // a one-connection echo server
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			io.Copy(c, c)
		})

		var out strings.Builder
		require.NoError(t, run(t.Context(), ln.Addr().String(), tr.Config, "hello, rsock", &out))
		require.Contains(t, out.String(), "connected to "+ln.Addr().String())
		require.Contains(t, out.String(), tr.Pick("over rdma\necho: hello, rsock\n", "over tcp\nnot rdma: rsock: upgrade to rdma: no RDMA device"))
	})
}

// TestRunQUIC: with -quic, the client trusts the certificate file it is given and
// echoes over QUIC.
func TestRunQUIC(t *testing.T) {
	cfg, err := config(false, "")
	require.NoError(t, err)
	require.Nil(t, cfg, "without -quic, the defaults")
	_, err = config(true, filepath.Join(t.TempDir(), "missing.pem"))
	require.Error(t, err)

	dir := t.TempDir()
	certFile := filepath.Join(dir, "cert.pem")
	stls, _, err := examplecert.ServerConfig(certFile, filepath.Join(dir, "key.pem"))
	require.NoError(t, err)
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", &rsock.Config{Fallback: rsock.FallbackQUIC, TLSConfig: stls, DisableRDMA: true})
	require.NoError(t, err)
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	})
	cfg, err = config(true, certFile)
	require.NoError(t, err)
	cfg.DisableRDMA = true // the fallback under test, even on a machine with RDMA
	var out strings.Builder
	require.NoError(t, run(t.Context(), ln.Addr().String(), cfg, "hello, quic", &out))
	require.Contains(t, out.String(), "over quic\n")
	require.Contains(t, out.String(), "echo: hello, quic\n")
}
