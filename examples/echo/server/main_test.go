package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"testing"

	"github.com/stretchr/testify/require"

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
