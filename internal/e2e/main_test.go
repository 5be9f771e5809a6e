package e2e

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/internal/harness"
)

func TestMain(m *testing.M) {
	harness.VerifyTestMain(m)
}

// maxMsg is the largest message the tests send: grpc-go's limits (4 MiB to receive by
// default) are raised to it on both ends.
const maxMsg = 16 << 20

// grpcServer is an unmodified grpc.Server serving echosvc on a recording Listener.
type grpcServer struct {
	*grpc.Server
	ln     *harness.Listener
	served chan error // Serve's result
}

// serveGRPC serves srv on a new Listener of env. The server is stopped when the test
// ends.
func serveGRPC(t *testing.T, env *harness.Env, srv echosvc.Server) *grpcServer {
	t.Helper()
	s := &grpcServer{
		Server: grpc.NewServer(grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg)),
		ln:     env.Listen(t),
		served: make(chan error, 1),
	}
	echosvc.Register(s.Server, srv)
	go func() { s.served <- s.Serve(s.ln) }()
	t.Cleanup(func() {
		s.Stop()
		require.NoError(t, s.wait())
	})
	return s
}

// wait returns Serve's result once it has returned; it may be called more than once.
func (s *grpcServer) wait() error {
	err := <-s.served
	s.served <- err
	return err
}

// dialGRPC returns a client of addr whose connections go through d, with grpc-go's
// message size limits raised to maxMsg. It is closed when the test ends.
func dialGRPC(t *testing.T, d *harness.Dialer, addr string) (*echosvc.Client, *grpc.ClientConn) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithContextDialer(d.DialAddr),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)),
	)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return echosvc.NewClient(cc), cc
}

// grpcPair serves srv on env's transport and returns a client of it.
func grpcPair(t *testing.T, env *harness.Env, srv echosvc.Server) (*grpcServer, *echosvc.Client, *harness.Dialer) {
	t.Helper()
	s := serveGRPC(t, env, srv)
	d := env.Dialer()
	c, _ := dialGRPC(t, d, s.ln.Addr().String())
	return s, c, d
}

// requireTransports checks that the server and the client each made exactly one
// connection, carried by env's transport.
func requireTransports(t *testing.T, env *harness.Env, s *grpcServer, d *harness.Dialer) {
	t.Helper()
	harness.RequireTransport(t, env.Want, s.ln.Conns(), 1, "server")
	harness.RequireTransport(t, env.Want, d.Conns(), 1, "client")
}
