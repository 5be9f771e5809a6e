// Command rsockperf measures rsock against what it is built on and competes with, in
// the spirit of ib_write_bw and qperf: raw soft verbs (as they are, and making the
// three copies a socket makes), rsock over (soft) RDMA, raw TCP,
// rsock over TCP, a raw quic-go stream, rsock over QUIC, and a unix socket and
// net.Pipe as references. It runs the workloads of the go test benchmarks in
// ./benchmarks (the same code, from benchmarks/internal/workload) and prints each
// figure with its ratio to the baseline of its kind.
//
// # Usage
//
// Both sides in one process (the default), every transport and workload:
//
//	go run ./benchmarks/cmd/rsockperf                  # about 3 minutes
//	go run ./benchmarks/cmd/rsockperf -short           # under a minute
//	go run ./benchmarks/cmd/rsockperf -count 3 -json out.json -svg out.svg
//
// A selection:
//
//	rsockperf -transports RsockRDMA,SoftVerbs,RawTCP -workloads stream,pingpong -sizes 64,64KiB
//	rsockperf -workloads conns -conns 1,16,256 -duration 3s
//
// The footprint of idle connections (5,000 each, both ends in this process):
//
//	rsockperf -mode idle -transports RsockRDMA -conns 5000
//
// Server and client in two processes. The server listens on consecutive ports, one per
// transport (a unix socket's path is derived from its port number); the client must
// name the same transports in the same order:
//
//	rsockperf -mode server -addr :7000 -transports RawTCP,RsockTCP,RawQUIC,RsockQUIC
//	rsockperf -mode client -addr host:7000 -transports RawTCP,RsockTCP,RawQUIC,RsockQUIC
//
// Across processes RsockRDMA uses rsock's default provider (rdma-core when built with
// -tags rdma and a device is present), and QUIC clients do not verify the server's
// throw-away certificate. SoftVerbs and Pipe exist in one process only.
//
// # Output
//
// A header names the command, the machine, the commit measured and, on the "cores:"
// line, the cross-core round trip: how long two goroutines on two processors take to
// hand a value back and forth, probed when the run starts and before each round of
// measurements (median, and range over the probes). On a VM the host may place the
// processors near or far apart and move them during a run, and figures that hand data
// between cores move with it; the report adds a note when the probes differ by more
// than 2×. Compare figures only between runs whose probes agree (see the README for
// the soft ping-pong's own modes, which the probe does not show).
//
// Then one table per workload: its figure (MB/s, operations per second, or median latency
// with p99 and p999), allocations per operation, the spread over -count runs, and the
// ratios to the transport's baseline (RsockRDMA: SoftVerbs3Copy, so that the ratio is
// the socket layer's own cost, or SoftVerbs where that did not run, or RawTCP where
// neither runs the workload; SoftVerbs3Copy: SoftVerbs; RsockTCP: RawTCP; RsockQUIC:
// RawQUIC; Unix and Pipe: RawTCP) and to RawTCP. Then the idle footprint and the
// performance targets, each met or missed by how much. -json writes all of it, -svg a
// plot of stream throughput against write size. Progress goes to standard error.
//
// The exit status is 0 when every measurement ran and every target measured was met,
// 1 when a measurement failed or a target was MISSED (the report is still written), and
// 2 for bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the parsed flags.
type options struct {
	mode       string
	addr       string
	transports []workload.Transport
	workloads  []workload.Workload
	sizes      []int
	conns      []int
	duration   time.Duration
	count      int
	short      bool
	idleConns  int
	jsonOut    string
	svgOut     string
	cpuProfile string
	quiet      bool
	topts      workload.Options
	command    string
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "rsockperf:", err)
		return 2
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "rsockperf:", err)
			return 1
		}
		pprof.StartCPUProfile(f)
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	switch o.mode {
	case "server":
		err = serve(o, stderr)
	default:
		err = measure(o, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "rsockperf:", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("rsockperf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.StringVar(&o.mode, "mode", "local", "`mode`: local (server and client in this process), server, client, or idle (footprint of idle connections)")
	fs.StringVar(&o.addr, "addr", "", "server: address to listen on; client: server address (first transport's port; the next ones follow)")
	transports := fs.String("transports", "", "comma-separated `transports` (default all): "+transportNames())
	workloads := fs.String("workloads", "", "comma-separated `workloads` (default all): "+workloadNames())
	sizes := fs.String("sizes", "", "comma-separated message `sizes` (64, 4KiB, 1MiB...), replacing each workload's own")
	conns := fs.String("conns", "", "comma-separated connection or caller `counts`, replacing each workload's own; with -mode idle, the number of idle connections (default 5000)")
	fs.DurationVar(&o.duration, "duration", time.Second, "how long each measurement runs")
	fs.IntVar(&o.count, "count", 1, "runs of each measurement, interleaved across transports; the median is reported")
	fs.BoolVar(&o.short, "short", false, "quick run, under a minute: 200 ms per measurement, 64-connection conns, 200 idle connections")
	fs.StringVar(&o.jsonOut, "json", "", "write the results as JSON to `file`")
	fs.StringVar(&o.svgOut, "svg", "", "write a plot of stream throughput by write size to `file` (SVG)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile to `file`")
	fs.BoolVar(&o.quiet, "q", false, "no progress on standard error")
	fs.IntVar(&o.topts.RingSize, "ring", 0, "RsockRDMA receive ring `bytes` (Config.RingSize; 0: rsock's default, 8 KiB growing to 4 MiB; 128 KiB or more: a fixed ring)")
	fs.IntVar(&o.topts.SendBufferSize, "sendbuf", 0, "RsockRDMA send staging buffer `bytes` (Config.SendBufferSize)")
	fs.IntVar(&o.topts.RecvWQEs, "wqes", 0, "RsockRDMA receive WQEs (Config.RecvWQEs; 0: rsock's default, 64 growing to 128; set: a fixed count)")
	fs.IntVar(&o.topts.PollSpin, "spin", 0, "RsockRDMA empty polls before sleeping (Config.PollSpin; negative: never spin)")
	fs.BoolVar(&o.topts.NoDirectPlacement, "noplace", false, "RsockRDMA without direct placement into large Reads' buffers (Config.NoDirectPlacement)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rsockperf [flags]\n\nrsockperf compares rsock's transports with the raw ones they build on. See go doc ./benchmarks/cmd/rsockperf.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.command = "rsockperf " + strings.Join(args, " ")
	switch o.mode {
	case "local", "server", "client", "idle":
	default:
		return nil, fmt.Errorf("unknown -mode %q", o.mode)
	}
	if (o.mode == "server" || o.mode == "client") && o.addr == "" {
		return nil, fmt.Errorf("-mode %s needs -addr", o.mode)
	}
	if o.count < 1 || o.duration <= 0 {
		return nil, errors.New("-count and -duration must be positive")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.short && !set["duration"] {
		o.duration = 200 * time.Millisecond
	}

	var err error
	if o.transports, err = parseTransports(*transports, o.mode); err != nil {
		return nil, err
	}
	if o.workloads, err = parseWorkloads(*workloads); err != nil {
		return nil, err
	}
	if o.sizes, err = parseList(*sizes, parseSize); err != nil {
		return nil, fmt.Errorf("-sizes: %w", err)
	}
	if o.conns, err = parseList(*conns, strconv.Atoi); err != nil {
		return nil, fmt.Errorf("-conns: %w", err)
	}
	if o.mode == "idle" {
		o.idleConns = 5000
		if o.short {
			o.idleConns = 200
		}
		if len(o.conns) > 0 {
			o.idleConns = o.conns[0]
		}
	}
	return o, nil
}

func transportNames() string {
	var s []string
	for _, t := range workload.Transports() {
		s = append(s, t.Name)
	}
	return strings.Join(s, ", ")
}

func workloadNames() string {
	var s []string
	for _, w := range workload.Workloads() {
		s = append(s, w.Name)
	}
	return strings.Join(s, ", ")
}

func parseTransports(list, mode string) ([]workload.Transport, error) {
	var ts []workload.Transport
	if list == "" {
		for _, t := range workload.Transports() {
			if (mode == "local" || mode == "idle" || !t.LocalOnly) && (mode != "idle" || !t.Raw) {
				ts = append(ts, t)
			}
		}
		return ts, nil
	}
	for _, name := range strings.Split(list, ",") {
		t, ok := workload.Lookup(strings.TrimSpace(name))
		if !ok {
			return nil, fmt.Errorf("unknown transport %q; transports: %s", name, transportNames())
		}
		if t.LocalOnly && mode != "local" && mode != "idle" {
			return nil, fmt.Errorf("%s runs in one process only", t.Name)
		}
		if t.Raw && mode == "idle" {
			return nil, fmt.Errorf("%s has no connections to hold idle", t.Name)
		}
		ts = append(ts, t)
	}
	return ts, nil
}

func parseWorkloads(list string) ([]workload.Workload, error) {
	if list == "" {
		return workload.Workloads(), nil
	}
	var ws []workload.Workload
	for _, name := range strings.Split(list, ",") {
		w, ok := workload.LookupWorkload(strings.TrimSpace(name))
		if !ok {
			return nil, fmt.Errorf("unknown workload %q; workloads: %s", name, workloadNames())
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func parseList(list string, parse func(string) (int, error)) ([]int, error) {
	if list == "" {
		return nil, nil
	}
	var vs []int
	for _, s := range strings.Split(list, ",") {
		v, err := parse(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		if v < 1 {
			return nil, fmt.Errorf("%q is not positive", s)
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// parseSize reads 64, 64B, 4KiB, 4K, 1MiB or 1M.
func parseSize(s string) (int, error) {
	mult := 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"MiB", 1 << 20}, {"KiB", 1 << 10}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	return n * mult, nil
}

// transportAddr is where transport number i of a server or client at base lives: the
// port after base's i times, or a unix socket path named after that port.
func transportAddr(base string, i int, t workload.Transport) (string, error) {
	host, port, err := net.SplitHostPort(base)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("-addr %s: the port must be a number", base)
	}
	if t.Name == workload.Unix {
		return filepath.Join(os.TempDir(), fmt.Sprintf("rsockperf-%d.sock", p+i)), nil
	}
	return net.JoinHostPort(host, strconv.Itoa(p+i)), nil
}

// serve runs a server for each transport until interrupted.
func serve(o *options, stderr io.Writer) error {
	var servers []*workload.Server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for i, t := range o.transports {
		addr, err := transportAddr(o.addr, i, t)
		if err != nil {
			return err
		}
		if t.Name == workload.Unix {
			os.Remove(addr)
		}
		s, err := workload.Listen(t, addr, o.topts)
		if err != nil {
			return err
		}
		servers = append(servers, s)
		fmt.Fprintf(stderr, "rsockperf: serving %s on %s\n", t.Name, s.Addr())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	fmt.Fprintln(stderr, "rsockperf: stopping")
	return nil
}
