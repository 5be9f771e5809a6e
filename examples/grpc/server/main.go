// Command server is a stock grpc-go server, Served on an rsock Listener. It serves the
// echo service of internal/echosvc, a service written by hand so that no protoc step
// is needed, and logs which transport carried each connection.
//
// Run it and then the client, in two terminals:
//
//	go run ./examples/grpc/server
//	go run ./examples/grpc/client
//
// Ctrl-C stops it gracefully: calls in flight finish first.
package main

import (
	"context"
	"flag"
	"log"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"

	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/rsock"
)

// maxMsg raises grpc-go's 4 MiB default message limit.
const maxMsg = 16 << 20

func main() {
	addr := flag.String("addr", "127.0.0.1:9090", "address to listen on")
	flag.Parse()

	// The one change from a net.Listen server: rsock.Listen. The Config keeps the
	// defaults (RDMA when this side has a device, TCP otherwise) and sends rsock's
	// reports (failed handshakes at INFO and above) to the standard log.
	ln, err := rsock.Listen("tcp", *addr, &rsock.Config{Logger: slog.Default()})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("gRPC server listening on %s (Ctrl-C to stop)", ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, newServer(), transportLogger{ln, log.Default()}); err != nil {
		log.Fatal(err)
	}
}

// newServer returns a grpc.Server like any other, serving the echo service.
func newServer() *grpc.Server {
	s := grpc.NewServer(grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg))
	echosvc.Register(s, echosvc.Service{})
	return s
}

// serve serves s on ln until ctx ends, and then stops it gracefully.
func serve(ctx context.Context, s *grpc.Server, ln net.Listener) error {
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		s.GracefulStop() // waits for the calls in flight
		return <-served
	}
}

// transportLogger logs the transport of each connection the server accepts. A gRPC
// handler sees only its peer's address, so the Listener is the place to look.
type transportLogger struct {
	*rsock.Listener
	logger *log.Logger
}

func (l transportLogger) Accept() (net.Conn, error) {
	c, err := l.AcceptRsock()
	if err != nil {
		return nil, err
	}
	why := ""
	if err := c.FallbackReason(); err != nil {
		why = " (not rdma: " + err.Error() + ")"
	}
	l.logger.Printf("%s connected over %s%s", c.RemoteAddr(), c.Transport(), why)
	return c, nil
}
