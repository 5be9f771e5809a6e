// Command client sends a message to the rsock echo server (examples/echo/server),
// prints what comes back, and which transport carried it.
//
//	go run ./examples/echo/client -addr 127.0.0.1:7000 -msg "hello, rsock"
//
// With -quic it dials over QUIC, trusting the server certificate of -ca (for a server
// run with -quic and a self-signed certificate, the certificate file it wrote):
//
//	go run ./examples/echo/client -quic -ca echo-cert.pem
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/rsockio/rsock/examples/internal/examplecert"
	"github.com/rsockio/rsock/rsock"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7000", "address of the echo server")
	msg := flag.String("msg", "hello, rsock", "message to send")
	useQUIC := flag.Bool("quic", false, "dial over QUIC rather than TCP; needs -ca")
	caFile := flag.String("ca", "echo-cert.pem", "with -quic: the certificate (PEM) to trust for the server")
	flag.Parse()

	cfg, err := config(*useQUIC, *caFile)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, *addr, cfg, *msg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// config returns the client's Config: nil, the defaults (RDMA when both ends have a
// device, TCP otherwise), or with useQUIC the QUIC fallback, trusting the certificates
// of caFile.
func config(useQUIC bool, caFile string) (*rsock.Config, error) {
	if !useQUIC {
		return nil, nil
	}
	tlsConfig, err := examplecert.ClientConfig(caFile)
	if err != nil {
		return nil, err
	}
	return &rsock.Config{Fallback: rsock.FallbackQUIC, TLSConfig: tlsConfig}, nil
}

// run sends msg to the echo server at addr, closes its side and reads the answer.
func run(ctx context.Context, addr string, cfg *rsock.Config, msg string, out io.Writer) error {
	d := &rsock.Dialer{Config: cfg}
	c, err := d.DialRsock(ctx, "tcp", addr) // DialContext, returning the *rsock.Conn
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	fmt.Fprintf(out, "connected to %s over %s\n", addr, c.Transport())
	if why := c.FallbackReason(); why != nil {
		fmt.Fprintf(out, "not rdma: %v\n", why)
	}
	if _, err := io.WriteString(c, msg); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if err := c.CloseWrite(); err != nil { // the server sees EOF once it has the message
		return fmt.Errorf("close write: %w", err)
	}
	echo, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	fmt.Fprintf(out, "echo: %s\n", echo)
	if string(echo) != msg {
		return fmt.Errorf("the echo differs from the %d bytes sent", len(msg))
	}
	return nil
}
