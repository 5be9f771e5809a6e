// Command server is an rsock echo server: it sends every byte a client sends back to
// it, and logs which transport carried each connection.
//
// Run it and then the client, in two terminals:
//
//	go run ./examples/echo/server
//	go run ./examples/echo/client -msg "hello, rsock"
//
// Built with -tags rdma, on machines with RDMA devices, the connections use RDMA;
// otherwise they fall back to TCP, and the log says why.
package main

import (
	"context"
	"flag"
	"io"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/rsockio/rsock/rsock"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7000", "address to listen on")
	flag.Parse()

	// The one change from a net.Listen server: rsock.Listen. A nil Config means the
	// defaults: RDMA when this side has a device, TCP otherwise.
	ln, err := rsock.Listen("tcp", *addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("echo server listening on %s (Ctrl-C to stop)", ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, ln, log.Default()); err != nil {
		log.Fatal(err)
	}
}

// serve echoes on each connection ln accepts, until ctx ends. Then it closes ln and the
// open connections, and returns once their goroutines have ended.
func serve(ctx context.Context, ln *rsock.Listener, logger *log.Logger) error {
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.AcceptRsock() // Accept, but returning the *rsock.Conn
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		logger.Printf("%s connected over %s%s", c.RemoteAddr(), c.Transport(), whyNotRDMA(c))
		wg.Go(func() {
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			n, err := io.Copy(c, c) // until the client closes its side
			if err != nil && ctx.Err() == nil {
				logger.Printf("%s: %v", c.RemoteAddr(), err)
			}
			logger.Printf("%s: echoed %d bytes", c.RemoteAddr(), n)
		})
	}
}

// whyNotRDMA returns ", not rdma: " and the reason, or "" on RDMA.
func whyNotRDMA(c *rsock.Conn) string {
	if err := c.FallbackReason(); err != nil {
		return " (not rdma: " + err.Error() + ")"
	}
	return ""
}
