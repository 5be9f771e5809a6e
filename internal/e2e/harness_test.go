package e2e

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/harness"
)

// TestEnvWaitsForDialsInProgress ends a test while an RDMA dial is in its handshake, as
// http.Transport leaves a dial running once another connection served its request. The
// Env must wait for the dial to end before it checks that every soft RDMA resource was
// released: the dial's endpoint is released only when its handshake fails. The wait
// for dials itself is tested in internal/harness (TestRequireClosedWaitsForDials);
// here the whole path runs, with a real handshake failing after the test body ended,
// and the Env's checks must find every resource released.
func TestEnvWaitsForDialsInProgress(t *testing.T) {
	env := harness.Transport{Name: "rdma", RDMA: true}.Env(t)
	// A server that reads the client's first five bytes and then says nothing, so the
	// dial stays in its handshake with its endpoint allocated.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		// The magic (4 bytes) goes out before a cold device is prepared; the byte
		// after it, with the rest of the hello, once the endpoint exists.
		var b [5]byte
		io.ReadFull(c, b[:])
		accepted <- c
	}()
	d := env.Dialer()
	go func() {
		// The handshake fails when the server closes; the Env closes a connection only
		// if the harness records it, so close it here if the dial succeeds anyway.
		if c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String()); err == nil {
			c.Close()
		}
	}()
	srv := <-accepted
	require.NotNil(t, srv, "accept failed")
	require.NotZero(t, env.Fabric.Stats().QPs, "the dial has not prepared its endpoint")

	// Cleanups run in reverse order: this one, which fails the handshake, runs before the
	// Env's checks, which must then wait for the dial to end.
	t.Cleanup(func() {
		srv.Close()
		ln.Close()
	})
}
