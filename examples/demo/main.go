// Command demo runs the same net/http and grpc-go traffic over rsock on software RDMA
// and on TCP, side by side in one process, and prints a short comparison table.
//
//	go run ./examples/demo
//	go run ./examples/demo -duration 5s -clients 16 -transports rdma,tcp,quic
//
// Every server and client in it is a stock one (http.Server, http.Client, grpc.Server,
// grpc.ClientConn); only their Listener and dialer are rsock's. Each column checks that
// both ends of every connection reported the transport it names.
//
// The RDMA column uses rsock's software RDMA provider (verbs/soft): the real RDMA code
// path of rsock, with the "NIC" emulated in this process on the same CPU cores. It
// shows that the path works, not how fast RDMA hardware is.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 2*time.Second, "how long each measurement runs")
	flag.IntVar(&o.clients, "clients", 8, "concurrent clients in the request-rate measurements")
	transports := flag.String("transports", "rdma,tcp", "comma-separated columns: rdma (software RDMA), tcp, quic")
	flag.Parse()
	o.transports = strings.Split(*transports, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// options are the demo's settings.
type options struct {
	duration   time.Duration // of each measurement
	clients    int           // concurrent clients of the request-rate measurements
	transports []string      // the columns: "rdma", "tcp" or "quic"
}

// column is one transport's configuration and results.
type column struct {
	name           string // as in -transports
	title          string
	server, client *rsock.Config

	mu   sync.Mutex
	seen map[string]int // "client rdma", "server tcp", ...: connections per side and transport

	httpRate, grpcRate, bulkRate float64
}

// newColumn returns the configuration of one transport.
func newColumn(name string) (*column, error) {
	c := &column{name: name, seen: make(map[string]int)}
	switch name {
	case "rdma":
		// One software RDMA fabric shared by both ends: they are in this process.
		fab := soft.New(soft.Options{})
		c.title = "soft RDMA"
		c.server, c.client = &rsock.Config{Provider: fab}, &rsock.Config{Provider: fab}
	case "tcp":
		// A provider without devices keeps this column on TCP even where the default
		// provider would find an RDMA device.
		c.title = "TCP"
		c.server, c.client = &rsock.Config{Provider: noRDMA{}}, &rsock.Config{Provider: noRDMA{}}
	case "quic":
		st, ct, err := testcert.Configs() // a self-signed certificate, made in memory
		if err != nil {
			return nil, err
		}
		c.title = "QUIC"
		c.server = &rsock.Config{Provider: noRDMA{}, Fallback: rsock.FallbackQUIC, TLSConfig: st}
		c.client = &rsock.Config{Provider: noRDMA{}, Fallback: rsock.FallbackQUIC, TLSConfig: ct}
	default:
		return nil, fmt.Errorf("unknown transport %q (want rdma, tcp or quic)", name)
	}
	return c, nil
}

// run measures every column and prints the table to out.
func run(ctx context.Context, o options, out io.Writer) error {
	fmt.Fprintf(out, "rsock demo: stock net/http and grpc-go servers and clients, %v per measurement, %d clients\n\n",
		o.duration, o.clients)
	var cols []*column
	for _, name := range o.transports {
		c, err := newColumn(strings.TrimSpace(name))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%-10s HTTP ...", c.title)
		if c.httpRate, err = c.measureHTTP(ctx, o); err != nil {
			return fmt.Errorf("%s: HTTP: %w", c.title, err)
		}
		fmt.Fprint(out, " gRPC ...")
		if c.grpcRate, err = c.measureGRPC(ctx, o); err != nil {
			return fmt.Errorf("%s: gRPC: %w", c.title, err)
		}
		fmt.Fprint(out, " bulk ...")
		if c.bulkRate, err = c.measureBulk(ctx, o); err != nil {
			return fmt.Errorf("%s: bulk: %w", c.title, err)
		}
		fmt.Fprintln(out, " done")
		cols = append(cols, c)
	}
	fmt.Fprintln(out)
	return printTable(out, cols)
}

// printTable prints the results, one column per transport: labels left-aligned,
// cells right-aligned.
func printTable(out io.Writer, cols []*column) error {
	rows := [][]string{
		{""},
		{"transport (client/server)"},
		{"HTTP GET requests/s"},
		{"gRPC unary calls/s"},
		{"bulk transfer MB/s"},
	}
	for _, c := range cols {
		rows[0] = append(rows[0], c.title)
		rows[1] = append(rows[1], c.transports())
		rows[2] = append(rows[2], thousands(c.httpRate))
		rows[3] = append(rows[3], thousands(c.grpcRate))
		rows[4] = append(rows[4], thousands(c.bulkRate))
	}
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, cell := range r {
			width[i] = max(width[i], len(cell))
		}
	}
	for _, r := range rows {
		line := fmt.Sprintf("%-*s", width[0], r[0])
		for i, cell := range r[1:] {
			line += fmt.Sprintf("   %*s", width[i+1], cell)
		}
		if _, err := fmt.Fprintln(out, line); err != nil {
			return err
		}
	}
	for _, c := range cols {
		if c.name == "rdma" {
			fmt.Fprintln(out, "\nsoft RDMA is rsock's software RDMA provider: rsock's real RDMA code path, with the")
			fmt.Fprintln(out, "device emulated in this process on the same CPU cores. It shows the path works; it")
			fmt.Fprintln(out, "says nothing of RDMA hardware, where the NIC moves the bytes.")
			break
		}
	}
	return nil
}

// record notes that side ("client" or "server") got a connection on c's transport, and
// fails if that is not the transport the column is about.
func (c *column) record(side string, conn *rsock.Conn) error {
	c.mu.Lock()
	c.seen[side+" "+conn.Transport()]++
	c.mu.Unlock()
	if conn.Transport() != c.name {
		return fmt.Errorf("%s connection over %s, want %s (%v)", side, conn.Transport(), c.name, conn.FallbackReason())
	}
	return nil
}

// transports returns "client/server" transports seen, e.g. "rdma/rdma".
func (c *column) transports() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	side := func(s string) string {
		var ts []string
		for _, t := range []string{rsock.TransportRDMA, rsock.TransportTCP, rsock.TransportQUIC} {
			if c.seen[s+" "+t] > 0 {
				ts = append(ts, t)
			}
		}
		return strings.Join(ts, "+")
	}
	return side("client") + "/" + side("server")
}

// listen returns a Listener of the column's server Config whose Accept records the
// transport of each connection.
func (c *column) listen() (*recordingListener, error) {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", c.server)
	if err != nil {
		return nil, err
	}
	return &recordingListener{Listener: ln, col: c}, nil
}

type recordingListener struct {
	*rsock.Listener
	col *column
}

func (l *recordingListener) Accept() (net.Conn, error) {
	conn, err := l.AcceptRsock()
	if err != nil {
		return nil, err
	}
	if err := l.col.record("server", conn); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// dial dials with the column's client Config and records the connection's transport.
func (c *column) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := rsock.Dialer{Config: c.client}
	conn, err := d.DialRsock(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := c.record("client", conn); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// measureHTTP runs o.clients clients making GET requests for o.duration, and returns
// the requests per second.
func (c *column) measureHTTP(ctx context.Context, o options) (float64, error) {
	ln, err := c.listen()
	if err != nil {
		return 0, err
	}
	body := strings.Repeat("x", 64)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		<-served
	}()

	tr := rsockhttp.NewTransport(c.client)
	tr.DialContext = c.dial // the same dial, recording each connection's transport
	tr.MaxIdleConnsPerHost = o.clients
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	url := "http://" + ln.Addr().String() + "/"
	return load(ctx, o, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if string(b) != body {
			return fmt.Errorf("GET: %s: %d bytes", resp.Status, len(b))
		}
		return nil
	})
}

// measureGRPC runs o.clients goroutines making unary calls on one client connection
// for o.duration, and returns the calls per second.
func (c *column) measureGRPC(ctx context.Context, o options) (float64, error) {
	ln, err := c.listen()
	if err != nil {
		return 0, err
	}
	s := grpc.NewServer()
	echosvc.Register(s, echosvc.Service{})
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	defer func() {
		s.Stop()
		<-served
	}()

	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.dial(ctx, "tcp", addr)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	client := echosvc.NewClient(cc)
	msg := []byte(strings.Repeat("x", 64))
	return load(ctx, o, func(ctx context.Context) error {
		out, err := client.Echo(ctx, msg)
		if err == nil && len(out) != len(msg) {
			//lint:ignore ST1005 the message begins with the RPC's name, Echo
			err = fmt.Errorf("Echo: %d bytes back, want %d", len(out), len(msg))
		}
		return err
	})
}

// measureBulk writes 1 MiB at a time on one connection for o.duration; the server
// counts what it reads and sends the count back. It returns MB (10⁶ bytes) per second.
func (c *column) measureBulk(ctx context.Context, o options) (float64, error) {
	ln, err := c.listen()
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer conn.Close()
		n, err := io.Copy(io.Discard, conn)
		if err == nil {
			err = binary.Write(conn, binary.BigEndian, n)
		}
		served <- err
	}()

	conn, err := c.dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	buf := make([]byte, 1<<20)
	var sent int64
	start := time.Now()
	for end := start.Add(o.duration); time.Now().Before(end); {
		n, err := conn.Write(buf)
		sent += int64(n)
		if err != nil {
			return 0, err
		}
	}
	if err := conn.(*rsock.Conn).CloseWrite(); err != nil {
		return 0, err
	}
	var got int64
	if err := binary.Read(conn, binary.BigEndian, &got); err != nil {
		return 0, fmt.Errorf("read the server's count: %w", err)
	}
	elapsed := time.Since(start)
	if err := <-served; err != nil {
		return 0, err
	}
	if got != sent {
		return 0, fmt.Errorf("sent %d bytes, the server read %d", sent, got)
	}
	return float64(sent) / elapsed.Seconds() / 1e6, nil
}

// load runs op in a loop from o.clients goroutines for o.duration and returns the
// completed ops per second. Each goroutine stops at its first error.
func load(ctx context.Context, o options, op func(context.Context) error) (float64, error) {
	var done atomic.Int64
	errs := make(chan error, o.clients)
	start := time.Now()
	end := start.Add(o.duration)
	var wg sync.WaitGroup
	for range o.clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				if err := op(ctx); err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := errors.Join(drain(errs)...); err != nil {
		return 0, err
	}
	return float64(done.Load()) / elapsed.Seconds(), nil
}

func drain(errs <-chan error) []error {
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return all
}

// thousands formats v rounded to an integer, with thousands separators.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// noRDMA is a verbs provider without devices: a Config with it stays on its fallback
// transport, whatever RDMA hardware the machine has.
type noRDMA struct{}

func (noRDMA) Name() string                         { return "none" }
func (noRDMA) Devices() ([]verbs.DeviceAttr, error) { return nil, nil }
func (noRDMA) Open(string) (verbs.Context, error)   { return nil, verbs.ErrNoDevice }
