// Command stats shows rsock's process-wide counters: it serves HTTP over rsock, with
// expvar's /debug/vars, runs a mixed load against it, and prints the "rsock" variable:
// connections by transport, fallbacks by reason, handshake failures by cause, bytes by
// transport.
//
//	go run ./examples/stats              # run the load, print the counters, exit
//	go run ./examples/stats -serve       # then keep serving: curl localhost:7480/debug/vars
//
// The load is every kind of client a server meets: rsock clients that upgrade to RDMA
// (software RDMA, verbs/soft, in this process), one with RDMA disabled that stays on
// TCP, QUIC clients with and without RDMA (QUIC-bootstrapped RDMA runs TLS: "rdma+tls"),
// a stock net/http client, a raw net.Dial that speaks HTTP by hand, as curl would, and
// a client that opens a connection and sends nothing useful (a failed handshake). The
// server accepts plain clients (Config.AcceptPlainClients), so the stock ones are
// served, on TCP, with the fallback reason "plain_client".
//
// Both ends of every rsock connection live in this process, so each connection counts
// twice: once as the client's, once as the server's.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"expvar"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs/soft"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7480", "address to serve on (TCP and, for QUIC, UDP)")
	serve := flag.Bool("serve", false, "keep serving after the load, until interrupted")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, *serve, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves on addr, runs the load, prints the "rsock" variable as /debug/vars shows
// it, and, with serve, goes on serving until ctx ends.
func run(ctx context.Context, addr string, serve bool, out io.Writer) error {
	serverTLS, clientTLS, err := testcert.Configs() // a throw-away self-signed certificate
	if err != nil {
		return err
	}
	fabric := soft.New(soft.Options{}) // software RDMA devices, shared by both ends
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ln, err := rsock.Listen("tcp", addr, &rsock.Config{
		Provider:           fabric,
		Fallback:           rsock.FallbackQUIC, // serves TCP clients too
		TLSConfig:          serverTLS,
		AcceptPlainClients: true,
		Logger:             logger,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/debug/vars", expvar.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over %s\n", rsockhttp.ConnTransport(r))
	})
	srv := &http.Server{Handler: mux, ConnContext: rsockhttp.ConnContext, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		<-served
	}()

	base := "http://" + ln.Addr().String()
	if err := load(ctx, base, ln.Addr().String(), fabric, clientTLS); err != nil {
		return err
	}
	vars, err := rsockVars(base)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "GET %s/debug/vars, variable %q:\n%s\n", base, "rsock", vars)
	if !serve {
		return nil
	}
	fmt.Fprintf(out, "serving on %s until interrupted: curl %s/debug/vars\n", ln.Addr(), base)
	<-ctx.Done()
	return nil
}

// load runs the mixed load: requestsEach requests from each kind of client, each on a
// connection of its own (keep-alives off), closed when the request is done.
func load(ctx context.Context, base, addr string, fabric *soft.Fabric, clientTLS *tls.Config) error {
	const requestsEach = 2
	quic := func(cfg *rsock.Config) *rsock.Config {
		cfg.Fallback, cfg.TLSConfig = rsock.FallbackQUIC, clientTLS
		return cfg
	}
	clients := []struct {
		name string
		c    *http.Client
	}{
		{"rsock, RDMA", rsockhttp.NewClient(&rsock.Config{Provider: fabric})},
		{"rsock, RDMA disabled", rsockhttp.NewClient(&rsock.Config{DisableRDMA: true})},
		{"rsock over QUIC, no RDMA", rsockhttp.NewClient(quic(&rsock.Config{}))},
		{"rsock over QUIC, RDMA", rsockhttp.NewClient(quic(&rsock.Config{Provider: fabric}))},
		{"stock net/http", &http.Client{Transport: &http.Transport{}}},
	}
	for _, cl := range clients {
		cl.c.Transport.(*http.Transport).DisableKeepAlives = true
		for range requestsEach {
			if err := get(ctx, cl.c, base+"/"); err != nil {
				return fmt.Errorf("%s: %w", cl.name, err)
			}
		}
		cl.c.CloseIdleConnections()
	}
	// curl's way: a plain TCP connection and an HTTP/1.0 request written by hand.
	for range requestsEach {
		if err := rawGet(ctx, addr); err != nil {
			return fmt.Errorf("raw net.Dial: %w", err)
		}
	}
	// A client that opens a connection and says nothing the server understands in time
	// is handed through as plain; one that sends the start of an rsock hello and then
	// garbage fails its handshake.
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("\x89RSK garbage, not a hello")); err != nil {
		return err
	}
	io.Copy(io.Discard, c) // the server closes it
	return nil
}

// get fetches url and checks the answer.
func get(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte("hello over ")) {
		return fmt.Errorf("GET %s: %s %q", url, resp.Status, body)
	}
	return nil
}

// rawGet sends a GET / by hand over a plain TCP connection and reads the answer.
func rawGet(ctx context.Context, addr string) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: stats\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if !bytes.Equal(body, []byte("hello over tcp\n")) {
		return fmt.Errorf("answer %q", body)
	}
	return nil
}

// rsockVars fetches /debug/vars with a stock client, as a monitoring system would, and
// returns its "rsock" variable, indented.
func rsockVars(base string) ([]byte, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get(base + "/debug/vars")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var vars map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&vars); err != nil {
		return nil, fmt.Errorf("/debug/vars: %w", err)
	}
	v, ok := vars["rsock"]
	if !ok {
		return nil, errors.New(`/debug/vars has no "rsock" variable`)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, v, "", "  "); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
