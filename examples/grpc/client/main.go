// Command client is a stock grpc-go client whose connection is dialed through rsock
// (grpc.WithContextDialer). It makes one call of each kind to the echo server
// (examples/grpc/server), times a burst of unary calls, and prints which transport
// carried them.
//
//	go run ./examples/grpc/server      # in another terminal
//	go run ./examples/grpc/client -addr 127.0.0.1:9090
package main

//lint:file-ignore ST1005 error messages begin with the name of the RPC that failed (Echo, Generate, ...)

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/rsock"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9090", "address of the gRPC server")
	calls := flag.Int("calls", 1000, "how many unary calls to time")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A nil Config: RDMA when both ends have a device, TCP otherwise.
	if err := run(ctx, *addr, nil, *calls, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run calls the echo service at addr.
func run(ctx context.Context, addr string, cfg *rsock.Config, calls int, out io.Writer) error {
	d := &rsock.Dialer{Config: cfg}
	var mu sync.Mutex
	var conns []*rsock.Conn // what grpc-go dialed; it dials from its own goroutines
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := d.DialRsock(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			return c, nil
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()), // rsock has no TLS of its own
	)
	if err != nil {
		return err
	}
	defer cc.Close()
	c := echosvc.NewClient(cc)

	// Unary.
	reply, err := c.Echo(ctx, []byte("hello, rsock"))
	if err != nil {
		return fmt.Errorf("Echo: %w", err)
	}
	mu.Lock()
	for _, c := range conns {
		fmt.Fprintf(out, "connected to %s over %s\n", c.RemoteAddr(), c.Transport())
		if why := c.FallbackReason(); why != nil {
			fmt.Fprintf(out, "not rdma: %v\n", why)
		}
	}
	mu.Unlock()
	fmt.Fprintf(out, "Echo: %s\n", reply)

	// Server streaming: 64 messages of 64 KiB.
	gen, err := c.Generate(ctx, 64, 64<<10)
	if err != nil {
		return fmt.Errorf("Generate: %w", err)
	}
	var got int
	for ; ; got++ {
		m, err := gen.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("Generate: %w", err)
		}
		if !bytes.Equal(m.Data, echosvc.Fill(got, 64<<10)) {
			return fmt.Errorf("Generate: message %d differs", got)
		}
	}
	fmt.Fprintf(out, "Generate: %d messages of 64 KiB\n", got)

	// Client streaming: 10 messages of 1 MiB, and the server's digest of them.
	dig, err := c.Digest(ctx)
	if err != nil {
		return fmt.Errorf("Digest: %w", err)
	}
	h := sha256.New()
	for i := range 10 {
		b := echosvc.Fill(i, 1<<20)
		h.Write(b)
		if err := dig.Send(&echosvc.Message{Data: b}); err != nil {
			return fmt.Errorf("Digest: %w", err)
		}
	}
	sum, err := dig.CloseAndRecv()
	if err != nil {
		return fmt.Errorf("Digest: %w", err)
	}
	if !bytes.Equal(sum.Data, echosvc.DigestOf(10<<20, h.Sum(nil)).Data) {
		return errors.New("Digest: the server's digest differs")
	}
	fmt.Fprintf(out, "Digest: 10 MiB sent, the server's SHA-256 matches\n")

	// Bidirectional streaming: ping-pong.
	chat, err := c.Chat(ctx)
	if err != nil {
		return fmt.Errorf("Chat: %w", err)
	}
	for _, word := range []string{"ping", "pong", "done"} {
		if err := chat.Send(&echosvc.Message{Data: []byte(word)}); err != nil {
			return fmt.Errorf("Chat: %w", err)
		}
		m, err := chat.Recv()
		if err != nil {
			return fmt.Errorf("Chat: %w", err)
		}
		fmt.Fprintf(out, "Chat: %s\n", m.Data)
	}
	if err := chat.CloseSend(); err != nil {
		return fmt.Errorf("Chat: %w", err)
	}
	if _, err := chat.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("Chat: after close: %v", err)
	}

	// A burst of small unary calls, one after another.
	start := time.Now()
	for range calls {
		if _, err := c.Echo(ctx, []byte("x")); err != nil {
			return fmt.Errorf("Echo: %w", err)
		}
	}
	if calls > 0 {
		el := time.Since(start)
		fmt.Fprintf(out, "%d Echo calls in %v: %.1f µs per call\n", calls, el.Round(time.Millisecond), float64(el.Microseconds())/float64(calls))
	}
	return nil
}
