package workload

import (
	"fmt"
	"strings"
	"sync"
)

// Params parameterize a workload run.
type Params struct {
	// Size is the message size in bytes: each write of stream and conns, each message
	// of pingpong and grpc, each response body of http.
	Size int
	// Conns is the number of connections (conns) or of concurrent callers (http, grpc).
	Conns int
}

// Workload is one kind of measurement.
type Workload struct {
	Name string
	Desc string
	// Figure is what a table shows of a run, and the unit it is compared in:
	// "MB/s" (throughput), "ops/s" (operations per second) or "p50" (median latency).
	Figure string
	// Sizes and Conns are the parameters a full run covers.
	Sizes []int
	Conns []int
	// Raw tells whether the workload runs on raw transports too (SoftVerbs).
	Raw bool
	// Run measures: it runs operations while ctl.Next reports true.
	Run func(ctl Control, env *Env, p Params) (Metrics, error)
}

// Workload names.
const (
	Stream   = "stream"
	PingPong = "pingpong"
	Conns    = "conns"
	Setup    = "setup"
	HTTP     = "http"
	GRPC     = "grpc"
)

// Sizes of the http workload's response bodies.
const (
	HTTPTiny = 2
	HTTPBig  = 1 << 20
)

var workloads = []Workload{
	{Name: Stream, Figure: "MB/s", Raw: true, Run: runStream,
		Sizes: []int{64, 4 << 10, 64 << 10, 1 << 20}, Conns: []int{1},
		Desc: "one-way stream of Size-byte writes on one connection"},
	{Name: PingPong, Figure: "p50", Raw: true, Run: runPingPong,
		Sizes: []int{64, 4 << 10}, Conns: []int{1},
		Desc: "Size-byte message and its echo, one at a time; round-trip percentiles"},
	{Name: Conns, Figure: "MB/s", Run: runConns,
		Sizes: []int{64 << 10}, Conns: []int{1, 16, 256},
		Desc: "Conns connections streaming Size-byte writes at once; aggregate throughput"},
	{Name: Setup, Figure: "p50", Run: runSetup,
		Sizes: []int{1}, Conns: []int{1},
		Desc: "dial, preamble and the server's first byte back, then close; dial-to-first-byte percentiles"},
	{Name: HTTP, Figure: "ops/s", Run: runHTTP,
		Sizes: []int{HTTPTiny, HTTPBig}, Conns: []int{8},
		Desc: "net/http GETs of a Size-byte body by Conns callers over keep-alive connections"},
	{Name: GRPC, Figure: "ops/s", Run: runGRPC,
		Sizes: []int{64}, Conns: []int{8},
		Desc: "grpc-go unary calls of Size bytes each way by Conns callers on one client connection"},
}

// Workloads returns every workload, in the order tables list them.
func Workloads() []Workload { return append([]Workload(nil), workloads...) }

// LookupWorkload returns the workload named name, ignoring case.
func LookupWorkload(name string) (Workload, bool) {
	for _, w := range workloads {
		if strings.EqualFold(w.Name, name) {
			return w, true
		}
	}
	return Workload{}, false
}

// Runs reports whether w runs on t.
func (w Workload) Runs(t Transport) bool { return w.Raw || !t.Raw }

// SizeName spells a size as benchmark names do: 64B, 4KiB, 1MiB.
func SizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// fanOut runs op on workers goroutines, once per operation ctl hands out: the calling
// goroutine passes each operation to whichever worker is free. At most workers
// operations are still running when ctl stops, which a long enough run makes
// negligible. It returns the first error an op returns.
func fanOut(ctl Control, workers int, op func(worker int) error) error {
	tokens := make(chan struct{})
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range tokens {
				if err := op(w); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	var err error
loop:
	for ctl.Next() {
		select {
		case tokens <- struct{}{}:
		case err = <-errc:
			break loop
		}
	}
	close(tokens)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}
