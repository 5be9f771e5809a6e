package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/rsockio/rsock/internal/e2e/harness"
	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the client against the echo service, over soft RDMA and over TCP.
func TestRun(t *testing.T) {
	tests := []struct {
		name     string
		provider bool // give both ends the software RDMA provider
		want     string
	}{
		{"rdma", true, " over rdma\nEcho: hello, rsock\n"},
		{"tcp", false, " over tcp\nnot rdma: rsock: upgrade to rdma: no RDMA device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &rsock.Config{Provider: harness.NoRDMA{}} // TCP, even on a machine with RDMA
			if tt.provider {
				cfg.Provider = soft.New(soft.Options{})
			}
			ln, err := rsock.Listen("tcp", "127.0.0.1:0", cfg)
			require.NoError(t, err)
			s := grpc.NewServer()
			echosvc.Register(s, echosvc.Service{})
			served := make(chan error, 1)
			go func() { served <- s.Serve(ln) }()

			var out strings.Builder
			require.NoError(t, run(t.Context(), ln.Addr().String(), cfg, 10, &out))
			got := out.String()
			require.Equal(t, 1, strings.Count(got, "connected to"), got)
			for _, line := range []string{
				tt.want,
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
}
