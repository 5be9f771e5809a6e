// Command server is a stock net/http server whose Listener is an rsock one. It answers
// GET / with the transport that carried the request, and POST /sha256 with the length
// and SHA-256 of the request body.
//
// Run it and then a client, in two terminals:
//
//	go run ./examples/http/server
//	go run ./examples/http/client
//	curl http://127.0.0.1:8080/        # a plain client is served too, over TCP
//
// Ctrl-C shuts it down gracefully: requests in flight finish first.
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/rsock"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	flag.Parse()

	srv := newServer(*addr, log.Default())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx) // net/http's own graceful shutdown
	}()

	log.Printf("serving http://%s (Ctrl-C to stop)", *addr)
	// AcceptPlainClients: clients that know nothing of rsock (curl, browsers) are served
	// too, over TCP. Logger: rsock's reports (failed handshakes at INFO and above) go to
	// the standard log, beside the server's own.
	err := rsockhttp.ListenAndServe(srv, &rsock.Config{AcceptPlainClients: true, Logger: slog.Default()})
	if !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// newServer returns the server: a plain http.Server, whose ConnContext lets handlers
// ask rsockhttp.ConnTransport which transport carried a request.
func newServer(addr string, logger *log.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from rsock over %s\n", rsockhttp.ConnTransport(r))
	})
	mux.HandleFunc("POST /sha256", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %x\n", n, h.Sum(nil))
	})
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger.Printf("%s %s %s over %s", r.RemoteAddr, r.Method, r.URL.Path, rsockhttp.ConnTransport(r))
		mux.ServeHTTP(w, r)
	})
	return &http.Server{Addr: addr, Handler: logged, ConnContext: rsockhttp.ConnContext}
}
