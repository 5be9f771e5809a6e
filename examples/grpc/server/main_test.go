package main

import (
	"bytes"
	"context"
	"log"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rsockio/rsock/internal/e2e/harness"
	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes, for a log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServe(t *testing.T) {
	tests := []struct {
		name     string
		provider bool // give both ends the software RDMA provider
		want     string
	}{
		{"rdma", true, "connected over rdma\n"},
		{"tcp", false, "connected over tcp (not rdma: rsock: upgrade to rdma: peer offered no RDMA)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &rsock.Config{Provider: harness.NoRDMA{}} // TCP, even on a machine with RDMA
			if tt.provider {
				cfg.Provider = soft.New(soft.Options{})
			}
			ln, err := rsock.Listen("tcp", "127.0.0.1:0", cfg)
			require.NoError(t, err)
			var logs syncBuffer
			serveCtx, stop := context.WithCancel(t.Context())
			defer stop()
			served := make(chan error, 1)
			go func() { served <- serve(serveCtx, newServer(), transportLogger{ln, log.New(&logs, "", 0)}) }()
			ctx := t.Context()

			d := &rsock.Dialer{Config: cfg}
			cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
				grpc.WithContextDialer(d.DialAddr),
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)))
			require.NoError(t, err)
			defer cc.Close()
			c := echosvc.NewClient(cc)
			big := echosvc.Fill(1, maxMsg) // above grpc-go's default limit of 4 MiB
			got, err := c.Echo(ctx, big)
			require.NoError(t, err)
			require.True(t, bytes.Equal(big, got), "Echo of %d bytes", len(big))

			// A stream open when the server is told to stop: it finishes first.
			stream, err := c.Chat(ctx)
			require.NoError(t, err)
			require.NoError(t, stream.Send(&echosvc.Message{Data: []byte("one")}))
			_, err = stream.Recv()
			require.NoError(t, err)
			stop()
			require.NoError(t, stream.Send(&echosvc.Message{Data: []byte("two")}))
			m, err := stream.Recv()
			require.NoError(t, err, "the stream goes on during a graceful stop")
			require.Equal(t, "two", string(m.Data))
			require.NoError(t, stream.CloseSend())
			require.NoError(t, <-served)
			require.Contains(t, logs.String(), tt.want)
		})
	}
}

var _ net.Listener = transportLogger{}
