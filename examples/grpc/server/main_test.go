package main

import (
	"bytes"
	"context"
	"log"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rsockio/rsock/examples/internal/exampletest"
	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/rsock"
)

func TestMain(m *testing.M) {
	exampletest.VerifyTestMain(m)
}

func TestServe(t *testing.T) {
	exampletest.ForEachTransport(t, func(t *testing.T, tr exampletest.Transport, ln *rsock.Listener) {
		srv := exampletest.Serve(t, func(ctx context.Context, logger *log.Logger) error {
			return serve(ctx, newServer(), transportLogger{ln, logger})
		})
		defer srv.Stop()
		ctx := t.Context()

		d := &rsock.Dialer{Config: tr.Config}
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
		srv.Stop()
		require.NoError(t, stream.Send(&echosvc.Message{Data: []byte("two")}))
		m, err := stream.Recv()
		require.NoError(t, err, "the stream goes on during a graceful stop")
		require.Equal(t, "two", string(m.Data))
		require.NoError(t, stream.CloseSend())
		require.NoError(t, srv.Wait())
		require.Contains(t, srv.Logs(), tr.Pick("connected over rdma\n", "connected over tcp (not rdma: rsock: upgrade to rdma: peer offered no RDMA)\n"))
	})
}

var _ net.Listener = transportLogger{}
