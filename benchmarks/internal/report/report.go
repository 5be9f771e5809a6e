// Package report turns rsockperf's measurements into what it prints and writes: a table
// with each figure and its ratio to the baseline of its kind, the targets rsock is held
// to, JSON, and an SVG plot of throughput against message size.
package report

import (
	"encoding/json"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// Report is everything one rsockperf run measured.
type Report struct {
	Command  string                `json:"command"`
	Machine  Machine               `json:"machine"`
	Started  time.Time             `json:"started"`
	Duration string                `json:"duration_per_run"`
	Count    int                   `json:"count"`
	Results  []Result              `json:"results,omitempty"`
	Idle     []workload.IdleResult `json:"idle,omitempty"`
	Targets  []Target              `json:"targets,omitempty"`
	Notes    []string              `json:"notes,omitempty"`
}

// Machine describes where the figures come from.
type Machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	CPU        string `json:"cpu"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	Kernel     string `json:"kernel,omitempty"`
	// Commit is the revision of rsock the binary was built from, with "-dirty" when the
	// tree had changes, so that a result can be told stale. Without a VCS stamp (go
	// run and go test stamp none) it is the working directory's rsock checkout's, or
	// "unknown".
	Commit string `json:"commit"`
	// CrossCoreRTTNs are the cross-core round trips in nanoseconds (CrossCoreRoundTrip),
	// in the order measured: one when the run started and, in rsockperf, one before
	// each round of measurements. None with GOMAXPROCS below 2. They tell which of the
	// host's placements of the processors, near or far, the figures were measured in.
	CrossCoreRTTNs []int64 `json:"cross_core_rtt_ns,omitempty"`
}

// ThisMachine describes the machine the process runs on.
func ThisMachine() Machine {
	return Machine{
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPU: cpuModel(),
		NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), Kernel: kernel(), Commit: buildCommit(),
	}
}

// buildCommit returns the VCS revision stamped into this binary or, without one (go
// run, go test), the commit of the rsock checkout in the working directory (gitCommit),
// or "unknown".
func buildCommit() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		if c := commitOf(info.Settings); c != "unknown" {
			return c
		}
	}
	if wd, err := os.Getwd(); err == nil {
		return gitCommit(wd)
	}
	return "unknown"
}

// commitOf picks the revision out of a binary's build settings: vcs.revision, with
// "-dirty" when vcs.modified says the tree had changes, or "unknown".
func commitOf(settings []debug.BuildSetting) string {
	var rev string
	var dirty bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		return "unknown"
	case dirty:
		return rev + "-dirty"
	}
	return rev
}

// Result is one workload with one set of parameters on one transport: the median of
// Count runs, by its figure.
type Result struct {
	Workload  string `json:"workload"`
	Transport string `json:"transport"`
	Size      int    `json:"size"`
	Conns     int    `json:"conns"`

	Runs        int     `json:"runs"`
	Ops         int64   `json:"ops"`
	Seconds     float64 `json:"seconds"`
	NsPerOp     float64 `json:"ns_per_op"`
	MBPerSec    float64 `json:"mb_per_s,omitempty"` // 10^6 bytes per second, as go test
	OpsPerSec   float64 `json:"ops_per_s"`
	AllocsPerOp float64 `json:"allocs_per_op"`
	BytesPerOp  float64 `json:"alloc_bytes_per_op"`
	P50         float64 `json:"p50_ns,omitempty"`
	P99         float64 `json:"p99_ns,omitempty"`
	P999        float64 `json:"p999_ns,omitempty"`
	// Spread is the figure's (max-min)/median over the runs, when there were several.
	Spread float64 `json:"spread,omitempty"`
	Err    string  `json:"error,omitempty"`

	// Baseline is the transport this result is compared with, and VsBaseline the
	// ratio of the figures (this/baseline); VsTCP the ratio to RawTCP's.
	Baseline   string  `json:"baseline,omitempty"`
	VsBaseline float64 `json:"vs_baseline,omitempty"`
	VsTCP      float64 `json:"vs_rawtcp,omitempty"`
}

// Run is one measurement, before runs of the same thing are merged into a Result.
type Run struct {
	Workload, Transport string
	Size, Conns         int
	Ops                 int64
	Elapsed             time.Duration
	AllocsPerOp         float64
	AllocBytesPerOp     float64
	Metrics             workload.Metrics
	Err                 error
}

// Figure returns r's figure as its workload defines it (see workload.Workload.Figure)
// and whether higher is better.
func (r Result) Figure() (v float64, higherBetter bool) {
	switch figureOf(r.Workload) {
	case "MB/s":
		return r.MBPerSec, true
	case "p50":
		return r.P50, false
	}
	return r.OpsPerSec, true
}

func figureOf(name string) string {
	w, _ := workload.LookupWorkload(name)
	return w.Figure
}

// Merge turns runs of one workload, parameters and transport into a Result: the run
// with the median figure, and the spread of the figures.
func Merge(runs []Run) Result {
	var rs []Result
	var failed *Result
	for _, run := range runs {
		r := Result{
			Workload: run.Workload, Transport: run.Transport, Size: run.Size, Conns: run.Conns,
			Runs: 1, Ops: run.Ops, Seconds: run.Elapsed.Seconds(),
			AllocsPerOp: run.AllocsPerOp, BytesPerOp: run.AllocBytesPerOp,
		}
		if run.Err != nil {
			r.Err = run.Err.Error()
			failed = &r
			continue
		}
		if run.Ops > 0 && run.Elapsed > 0 {
			r.NsPerOp = float64(run.Elapsed.Nanoseconds()) / float64(run.Ops)
			r.OpsPerSec = float64(run.Ops) / run.Elapsed.Seconds()
			r.MBPerSec = float64(run.Metrics.BytesPerOp) * r.OpsPerSec / 1e6
		}
		if l := run.Metrics.Latency; l != nil {
			r.P50, r.P99, r.P999 = float64(l.P50.Nanoseconds()), float64(l.P99.Nanoseconds()), float64(l.P999.Nanoseconds())
		}
		rs = append(rs, r)
	}
	if len(rs) == 0 {
		if failed != nil {
			failed.Runs = len(runs)
			return *failed
		}
		return Result{}
	}
	slices.SortFunc(rs, func(a, b Result) int {
		x, _ := a.Figure()
		y, _ := b.Figure()
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	m := rs[len(rs)/2]
	m.Runs = len(runs)
	if len(rs) > 1 {
		lo, _ := rs[0].Figure()
		hi, _ := rs[len(rs)-1].Figure()
		if mid, _ := m.Figure(); mid > 0 {
			m.Spread = (hi - lo) / mid
		}
	}
	if failed != nil {
		m.Err = "some runs failed: " + failed.Err
	}
	return m
}

// Compare fills in every result's ratios: to its transport's baseline, if it has one
// (RsockRDMA's is SoftVerbs3Copy, the socket's copies without the socket, or SoftVerbs
// where that did not run, or RawTCP where neither runs the workload), and to RawTCP.
func Compare(results []Result) {
	find := func(r Result, transport string) (Result, bool) {
		for _, o := range results {
			if o.Transport == transport && o.Workload == r.Workload && o.Size == r.Size && o.Conns == r.Conns && o.Err == "" {
				return o, true
			}
		}
		return Result{}, false
	}
	ratio := func(r, base Result) float64 {
		x, _ := r.Figure()
		y, _ := base.Figure()
		if y == 0 {
			return 0
		}
		return x / y
	}
	for i, r := range results {
		if r.Err != "" {
			continue
		}
		t, _ := workload.Lookup(r.Transport)
		bases := []string{t.Baseline}
		if t.Name == workload.RsockRDMA {
			bases = append(bases, workload.SoftVerbs, workload.RawTCP)
		}
		for _, b := range bases {
			if b == "" {
				continue
			}
			if base, ok := find(r, b); ok {
				results[i].Baseline = b
				results[i].VsBaseline = ratio(r, base)
				break
			}
		}
		if base, ok := find(r, workload.RawTCP); ok {
			results[i].VsTCP = ratio(r, base)
		}
	}
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
