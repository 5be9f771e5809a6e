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
//
// With -quic the fallback is QUIC (the server still serves TCP clients on the same
// port). QUIC is encrypted, so the server needs a certificate: -cert and -key name its
// PEM files, and when neither exists the server makes a self-signed certificate at
// start and writes it there, for the client to trust with -ca:
//
//	go run ./examples/echo/server -quic                 # writes echo-cert.pem, echo-key.pem
//	go run ./examples/echo/client -quic -ca echo-cert.pem
package main

import (
	"context"
	"flag"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/rsockio/rsock/examples/internal/examplecert"
	"github.com/rsockio/rsock/rsock"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7000", "address to listen on")
	useQUIC := flag.Bool("quic", false, "fall back to QUIC rather than TCP (TCP clients are still served); needs -cert and -key")
	certFile := flag.String("cert", "echo-cert.pem", "with -quic: the certificate (PEM); made self-signed, with -key, if neither file exists")
	keyFile := flag.String("key", "echo-key.pem", "with -quic: the certificate's private key (PEM)")
	flag.Parse()

	cfg, err := config(*addr, *useQUIC, *certFile, *keyFile, log.Default())
	if err != nil {
		log.Fatal(err)
	}
	// The one change from a net.Listen server: rsock.Listen.
	ln, err := rsock.Listen("tcp", *addr, cfg)
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

// config returns the server's Config: the defaults (RDMA when this side has a device,
// TCP otherwise), logging to slog.Default (the standard logger, so rsock's reports,
// such as a refused client that speaks no rsock, appear beside the server's own), and
// with useQUIC, the QUIC fallback with the certificate of certFile and keyFile, made
// self-signed for addr's host if neither exists.
func config(addr string, useQUIC bool, certFile, keyFile string, logger *log.Logger) (*rsock.Config, error) {
	cfg := &rsock.Config{Logger: slog.Default()}
	if !useQUIC {
		return cfg, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	tlsConfig, generated, err := examplecert.ServerConfig(certFile, keyFile, host)
	if err != nil {
		return nil, err
	}
	if generated {
		logger.Printf("made a self-signed certificate for %s in %s (key in %s); clients trust it with -ca %s", host, certFile, keyFile, certFile)
	}
	cfg.Fallback, cfg.TLSConfig = rsock.FallbackQUIC, tlsConfig
	return cfg, nil
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
