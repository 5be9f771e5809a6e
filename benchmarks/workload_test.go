package benchmarks

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// TestWorkloads runs every workload on every transport for a few operations, so that
// plain go test (and -race) checks what the benchmarks and rsockperf measure: that each
// workload moves what it should, reports what it should, and leaves nothing behind.
func TestWorkloads(t *testing.T) {
	const ops = 20
	for _, tr := range workload.Transports() {
		t.Run(tr.Name, func(t *testing.T) {
			env, err := workload.Start(tr, workload.Options{})
			require.NoError(t, err)
			for _, w := range workload.Workloads() {
				if !w.Runs(tr) {
					continue
				}
				p := workload.Params{Size: w.Sizes[0], Conns: min(w.Conns[len(w.Conns)-1], 4)}
				ctl := &workload.Timed{Duration: time.Minute, MaxOps: ops}
				m, err := w.Run(ctl, env, p)
				require.NoError(t, err, "%s on %s with %+v", w.Name, tr.Name, p)
				require.Equal(t, int64(ops), ctl.Ops(), "%s on %s: operations run", w.Name, tr.Name)
				if w.Figure == "p50" {
					require.NotNil(t, m.Latency, "%s on %s: latency", w.Name, tr.Name)
					require.Equal(t, ops, m.Latency.N, "%s on %s: latency samples", w.Name, tr.Name)
					require.LessOrEqual(t, m.Latency.P50, m.Latency.P99)
				}
			}
			require.NoError(t, env.Close())
			if f := env.Fabric(); f != nil {
				s := f.Stats()
				require.Zero(t, s.QPs+s.MRs+s.CQs+s.PDs+s.Contexts+s.CompChannels, "soft resources left: %+v", s)
			}
		})
	}
}

// TestIdleFootprint opens idle connections on each transport and checks what an RDMA
// connection holds against the target: at most 256 KiB of registered memory per end.
// rsockperf -mode idle -conns 5000 measures the same at scale.
func TestIdleFootprint(t *testing.T) {
	for _, tr := range workload.Transports() {
		if tr.Raw {
			continue
		}
		t.Run(tr.Name, func(t *testing.T) {
			n := 50
			if tr.Name == workload.RsockRDMA {
				n = 200
			}
			if testing.Short() {
				n = 10
			}
			env, err := workload.Start(tr, workload.Options{})
			require.NoError(t, err)
			defer func() { require.NoError(t, env.Close()) }()
			r, err := workload.Idle(env, n, nil)
			require.NoError(t, err)
			t.Logf("%s, %d idle connections: per end %.0f B heap, %.0f B registered, %.2f files, %.2f goroutines",
				tr.Name, n, r.HeapPerEnd, r.RegisteredPerEnd, r.FilesPerEnd, r.GoroutinesPerEnd)
			if tr.Name == workload.RsockRDMA {
				require.Equal(t, 2*n, r.SoftQPs, "QPs of %d connections", n)
				require.Positive(t, r.RegisteredPerEnd)
				require.LessOrEqual(t, r.RegisteredPerEnd, float64(32<<10), "registered bytes per idle connection end")
			}
		})
	}
}
