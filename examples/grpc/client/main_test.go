package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/rsockio/rsock/examples/internal/exampletest"
	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/rsock"
)

func TestMain(m *testing.M) {
	exampletest.VerifyTestMain(m)
}

// TestRun runs the client against the echo service, over soft RDMA and over TCP.
func TestRun(t *testing.T) {
	exampletest.ForEachTransport(t, func(t *testing.T, tr exampletest.Transport, ln *rsock.Listener) {
		s := grpc.NewServer()
		echosvc.Register(s, echosvc.Service{})
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()

		var out strings.Builder
		require.NoError(t, run(t.Context(), ln.Addr().String(), tr.Config, 10, &out))
		got := out.String()
		require.Equal(t, 1, strings.Count(got, "connected to"), got)
		for _, line := range []string{
			tr.Pick(" over rdma\nEcho: hello, rsock\n", " over tcp\nnot rdma: rsock: upgrade to rdma: no RDMA device"),
			"Generate: 64 messages of 64 KiB\n",
			"Digest: 10 MiB sent, the server's SHA-256 matches\n",
			"Chat: ping\nChat: pong\nChat: done\n",
			"10 Echo calls in ",
		} {
			require.Contains(t, got, line)
		}
		s.GracefulStop()
		require.NoError(t, <-served)
	})
}
