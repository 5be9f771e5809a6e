package benchmarks

import (
	"strconv"
	"testing"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// The comparison benchmarks run each workload of package workload on every transport it
// applies to, as sub-benchmarks by transport, then size (or connection count):
//
//	go test -bench 'Stream|PingPong' -count 5 ./benchmarks/
//
// Transports: SoftVerbs (raw verbs/soft, the ceiling of the RDMA path on it),
// RsockRDMA (rsock upgraded to RDMA over verbs/soft), RawTCP, RsockTCP, RawQUIC,
// RsockQUIC, and the references Unix and Pipe. The rsockperf command runs the same
// workloads and prints them side by side with their ratios (see README.md).

// BenchmarkStream is a one-way stream of 64 B, 4 KiB, 64 KiB and 1 MiB writes.
func BenchmarkStream(b *testing.B) { benchWorkload(b, workload.Stream) }

// BenchmarkPingPong is a 64 B or 4 KiB message and its echo, one at a time. It reports
// round-trip percentiles (p50-ns, p99-ns, p999-ns).
func BenchmarkPingPong(b *testing.B) { benchWorkload(b, workload.PingPong) }

// BenchmarkConns streams 64 KiB writes on 1, 16 and 256 connections at once; the
// throughput is their aggregate. An operation is 256 KiB written on one connection.
func BenchmarkConns(b *testing.B) { benchWorkload(b, workload.Conns) }

// BenchmarkSetup dials, reads the server's first byte and closes, one connection after
// the other. It reports percentiles of dial to first byte.
func BenchmarkSetup(b *testing.B) { benchWorkload(b, workload.Setup) }

// BenchmarkHTTP is net/http GETs of a 2-byte and a 1 MiB body by 8 concurrent callers;
// it reports requests per second (ops/s).
func BenchmarkHTTP(b *testing.B) { benchWorkload(b, workload.HTTP) }

// BenchmarkGRPC is grpc-go unary calls of 64 bytes each way by 8 concurrent callers on
// one client connection; it reports calls per second (ops/s).
func BenchmarkGRPC(b *testing.B) { benchWorkload(b, workload.GRPC) }

// BenchmarkIdle opens 200 idle connections, measures what they hold and closes them. Its
// metrics are per connection end (both ends live in the benchmark's process): live heap
// (heap-B/end; on verbs/soft it includes the registered memory, which soft allocates from
// the heap), goroutine stacks (stack-B/end), registered memory (reg-B/end, RsockRDMA
// only), open files and goroutines.
// Its time per operation is that of the whole cycle.
func BenchmarkIdle(b *testing.B) {
	const n = 200
	for _, tr := range workload.Transports() {
		if tr.Raw {
			continue
		}
		b.Run(tr.Name, func(b *testing.B) {
			env := startEnv(b, tr)
			b.Run(strconv.Itoa(n)+"conns", func(b *testing.B) {
				var r workload.IdleResult
				for b.Loop() {
					var err error
					if r, err = workload.Idle(env, n, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(r.HeapPerEnd, "heap-B/end")
				b.ReportMetric(r.StackPerEnd, "stack-B/end")
				if r.RegisteredPerEnd >= 0 {
					b.ReportMetric(r.RegisteredPerEnd, "reg-B/end")
				}
				b.ReportMetric(r.FilesPerEnd, "files/end")
				b.ReportMetric(r.GoroutinesPerEnd, "goroutines/end")
			})
		})
	}
}

// benchLoop makes testing.B's Loop a workload.Control.
type benchLoop struct{ b *testing.B }

func (l benchLoop) Next() bool { return l.b.Loop() }

// benchWorkload runs workload name on each transport, then each size and connection
// count of the workload.
func benchWorkload(b *testing.B, name string) {
	w, ok := workload.LookupWorkload(name)
	if !ok {
		b.Fatalf("no workload %q", name)
	}
	for _, tr := range workload.Transports() {
		if !w.Runs(tr) {
			continue
		}
		b.Run(tr.Name, func(b *testing.B) {
			env := startEnv(b, tr)
			for _, size := range w.Sizes {
				for _, conns := range w.Conns {
					p := workload.Params{Size: size, Conns: conns}
					if name := paramName(w, p); name != "" {
						b.Run(name, func(b *testing.B) { runBench(b, w, env, p) })
					} else {
						runBench(b, w, env, p)
					}
				}
			}
		})
	}
}

// paramName names a sub-benchmark by what varies in the workload: the size, the
// connection count, or both; "" for the setup workload, which has neither.
func paramName(w workload.Workload, p workload.Params) string {
	switch {
	case w.Name == workload.Setup:
		return ""
	case len(w.Sizes) > 1 && len(w.Conns) > 1:
		return workload.SizeName(p.Size) + "/" + strconv.Itoa(p.Conns) + "conns"
	case len(w.Conns) > 1:
		return strconv.Itoa(p.Conns) + "conns"
	}
	return workload.SizeName(p.Size)
}

func startEnv(b *testing.B, tr workload.Transport) *workload.Env {
	env, err := workload.Start(tr, workload.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := env.Close(); err != nil {
			b.Error(err)
		}
	})
	return env
}

func runBench(b *testing.B, w workload.Workload, env *workload.Env, p workload.Params) {
	b.ReportAllocs()
	m, err := w.Run(benchLoop{b}, env, p)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(m.BytesPerOp)
	if l := m.Latency; l != nil {
		b.ReportMetric(float64(l.P50.Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(l.P99.Nanoseconds()), "p99-ns")
		b.ReportMetric(float64(l.P999.Nanoseconds()), "p999-ns")
	}
	if w.Figure == "ops/s" && b.Elapsed() > 0 {
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	}
}
