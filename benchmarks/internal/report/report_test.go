package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// run makes a Run of ops operations in one second.
func run(wl, transport string, size int, ops int64, bytesPerOp int64, p50 time.Duration) Run {
	r := Run{Workload: wl, Transport: transport, Size: size, Conns: 1, Ops: ops, Elapsed: time.Second}
	r.Metrics.BytesPerOp = bytesPerOp
	if p50 > 0 {
		r.Metrics.Latency = &workload.Percentiles{N: 100, P50: p50, P99: 2 * p50, P999: 3 * p50}
	}
	return r
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name       string
		runs       []Run
		wantOps    int64
		wantSpread float64
		wantErr    bool
	}{
		{"one", []Run{run("stream", "RawTCP", 64, 100, 64, 0)}, 100, 0, false},
		{"median of three", []Run{
			run("stream", "RawTCP", 64, 300, 64, 0),
			run("stream", "RawTCP", 64, 100, 64, 0),
			run("stream", "RawTCP", 64, 200, 64, 0),
		}, 200, 1, false},
		{"failed runs are left out", []Run{
			run("stream", "RawTCP", 64, 100, 64, 0),
			{Workload: "stream", Transport: "RawTCP", Size: 64, Err: errors.New("boom")},
		}, 100, 0, true},
	}
	for _, tt := range tests {
		r := Merge(tt.runs)
		if r.Ops != tt.wantOps || !near(r.Spread, tt.wantSpread) || (r.Err != "") != tt.wantErr || r.Runs != len(tt.runs) {
			t.Errorf("%s: Merge = ops %d, spread %g, err %q, runs %d; want ops %d, spread %g, error %v, runs %d",
				tt.name, r.Ops, r.Spread, r.Err, r.Runs, tt.wantOps, tt.wantSpread, tt.wantErr, len(tt.runs))
		}
	}
	r := Merge([]Run{run("stream", "RawTCP", 64, 1000, 64, 0)})
	require.InDelta(t, 0.064, r.MBPerSec, 1e-9, "1000 ops of 64 bytes in a second")
	require.InDelta(t, 1e6, r.NsPerOp, 1e-9)
}

func TestCompareAndTargets(t *testing.T) {
	const kib64 = 64 << 10
	var results []Result
	add := func(r Run) { results = append(results, Merge([]Run{r})) }
	add(run("stream", workload.SoftVerbs, kib64, 1000, kib64, 0))
	add(run("stream", workload.RsockRDMA, kib64, 950, kib64, 0))
	add(run("stream", workload.RawTCP, kib64, 400, kib64, 0))
	add(run("stream", workload.RsockTCP, kib64, 390, kib64, 0))
	add(run("stream", workload.SoftVerbs, 1<<20, 100, 1<<20, 0))
	add(run("stream", workload.RsockRDMA, 1<<20, 65, 1<<20, 0))
	add(run("pingpong", workload.SoftVerbs, 64, 1, 128, 2*time.Microsecond))
	add(run("pingpong", workload.RsockRDMA, 64, 1, 128, 1500*time.Nanosecond))
	add(run("pingpong", workload.RawTCP, 64, 1, 128, 4*time.Microsecond))
	add(run("grpc", workload.RsockRDMA, 64, 120, 128, 0))
	add(run("grpc", workload.RawTCP, 64, 100, 128, 0))
	// Setup's figure is its p50, 2.1× TCP's, but its target is on connections per
	// second: 0.45× TCP's.
	add(run("setup", workload.RsockRDMA, 1, 4500, 1, 150*time.Microsecond))
	add(run("setup", workload.RawTCP, 1, 10000, 1, 70*time.Microsecond))
	Compare(results)

	want := map[string]struct {
		base          string
		vsBase, vsTCP float64
	}{
		"stream/" + workload.SoftVerbs:   {"", 0, 2.5},
		"stream/" + workload.RsockRDMA:   {workload.SoftVerbs, 0.95, 2.375},
		"stream/" + workload.RawTCP:      {"", 0, 1},
		"stream/" + workload.RsockTCP:    {workload.RawTCP, 0.975, 0.975},
		"pingpong/" + workload.RsockRDMA: {workload.SoftVerbs, 0.75, 0.375},
		"grpc/" + workload.RsockRDMA:     {workload.RawTCP, 1.2, 1.2}, // no SoftVerbs figure
	}
	for _, r := range results {
		w, ok := want[r.Workload+"/"+r.Transport]
		if !ok || r.Workload == "stream" && r.Size != kib64 {
			continue
		}
		if r.Baseline != w.base || !near(r.VsBaseline, w.vsBase) || !near(r.VsTCP, w.vsTCP) {
			t.Errorf("Compare: %s on %s = baseline %q ×%g, ×%g RawTCP; want %q ×%g, ×%g",
				r.Workload, r.Transport, r.Baseline, r.VsBaseline, r.VsTCP, w.base, w.vsBase, w.vsTCP)
		}
	}

	verdicts := map[string]bool{}
	measured := map[string]bool{}
	for _, tg := range Targets(results) {
		verdicts[tg.Name], measured[tg.Name] = tg.Pass, tg.Run
	}
	for name, pass := range map[string]bool{
		"RsockRDMA stream 64KiB ≥ 0.5× SoftVerbs":                             true,
		"RsockRDMA stream 1MiB ≥ 0.7× SoftVerbs":                              false,
		"RsockRDMA stream 64KiB ≥ 2× RawTCP":                                  true,
		"RsockRDMA pingpong 64B p50 ≤ 3× SoftVerbs":                           true,
		"RsockRDMA pingpong 64B p50 ≤ 0.3× RawTCP":                            false,
		"RsockTCP stream 64KiB ≥ 0.97× RawTCP":                                true,
		"RsockRDMA grpc ≥ 1.3× RawTCP calls/s":                                false,
		"RsockRDMA setup ≥ 0.5× RawTCP connections/s":                         false,
		"0 allocs/op: RsockRDMA and RsockTCP stream and pingpong, every size": true,
	} {
		if !measured[name] || verdicts[name] != pass {
			t.Errorf("target %q: measured %v, pass %v; want measured, pass %v", name, measured[name], verdicts[name], pass)
		}
	}
	if measured["RsockQUIC stream 64KiB ≥ 0.95× RawQUIC"] {
		t.Errorf("the QUIC target is measured without QUIC results")
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestVerdict(t *testing.T) {
	tests := []struct {
		t    Target
		want string
	}{
		{Target{Run: false}, "not measured"},
		{Target{Run: true, Pass: true}, "met"},
		{Target{Run: true, Value: 0.45, Limit: 0.9}, "MISSED by 50% (0.50× the limit)"},
		{Target{Run: true, Value: 0.33, Limit: 0.3, AtMost: true}, "MISSED by 10% (1.10× the limit)"},
	}
	for _, tt := range tests {
		if got := tt.t.Verdict(); got != tt.want {
			t.Errorf("%+v.Verdict() = %q, want %q", tt.t, got, tt.want)
		}
	}
}

func TestFormats(t *testing.T) {
	tests := []struct{ got, want string }{
		{Num(43725.4), "43725"},
		{Num(53.04), "53.0"},
		{Num(0.661), "0.66"},
		{Nanos(1420), "1.42µs"},
		{Nanos(139e3), "139µs"},
		{Nanos(1.02e6), "1.02ms"},
		{Nanos(0), "-"},
		{Ratio(0.1934), "0.19×"},
		{Ratio(19.2), "19.2×"},
		{Bytes(196608), "192.0 KiB"},
		{Bytes(2.5 * (1 << 20)), "2.5 MiB"},
		{Bytes(-512), "-512 B"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func sampleReport() *Report {
	r := &Report{Command: "rsockperf -test", Machine: ThisMachine(), Started: time.Now(), Duration: "1s", Count: 1}
	r.Machine.CrossCoreRTTNs = []int64{80, 78, 95} // fixed, as a probe on this machine may find anything
	for _, tr := range []string{workload.SoftVerbs, workload.RsockRDMA, workload.RawTCP} {
		for i, size := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
			r.Results = append(r.Results, Merge([]Run{run("stream", tr, size, int64(1000*(i+1)), int64(size), 0)}))
		}
	}
	r.Results = append(r.Results, Merge([]Run{run("pingpong", workload.RawTCP, 64, 1000, 128, 4*time.Microsecond)}))
	Compare(r.Results)
	r.Targets = Targets(r.Results)
	r.Idle = []workload.IdleResult{{Transport: workload.RsockRDMA, Conns: 10, Ends: 2, HeapPerEnd: 250 << 10, RegisteredPerEnd: 192 << 10}}
	r.Targets = append(r.Targets, IdleTargets(r.Idle)...)
	return r
}

func TestWriteText(t *testing.T) {
	r := sampleReport() // one report: see TestWriteJSON
	var b bytes.Buffer
	require.NoError(t, r.WriteText(&b))
	out := b.String()
	for _, want := range []string{"commit:    " + r.Machine.Commit, "\ncores:     cross-core round trip 80ns (78ns–95ns over 3 probes)\n", "stream:", "pingpong:", "SoftVerbs", "4KiB", "vs RawTCP", "idle:", "192.0 KiB", "targets:", "RsockRDMA stream 64KiB ≥ 2× RawTCP"} {
		require.Contains(t, out, want)
	}
}

func TestWriteJSON(t *testing.T) {
	// One report, written and compared with: each sampleReport reads the checkout's
	// state anew, which an edit between two calls changes ("-dirty").
	r := sampleReport()
	var b bytes.Buffer
	require.NoError(t, r.WriteJSON(&b))
	var back Report
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	require.Len(t, back.Results, 13)
	require.NotEmpty(t, back.Machine.Commit, "results say which code they measured")
	require.Equal(t, r.Machine.Commit, back.Machine.Commit)
	require.Equal(t, r.Machine.CrossCoreRTTNs, back.Machine.CrossCoreRTTNs, "the probes, in order")
	require.Contains(t, b.String(), `"cross_core_rtt_ns":`)
	require.Contains(t, b.String(), `"commit":`)
	require.Equal(t, "stream", back.Results[0].Workload)
}

func TestWriteSVG(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sampleReport().WriteSVG(&b))
	// Well-formed XML, with one line per transport and a point per size.
	dec := xml.NewDecoder(&b)
	lines, points := 0, 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "polyline":
				lines++
			case "circle":
				points++
			}
		}
	}
	require.Equal(t, 3, lines, "lines")
	require.Equal(t, 12, points, "points")

	require.Error(t, (&Report{}).WriteSVG(io.Discard), "a report without stream results")
	require.True(t, strings.HasPrefix(throughputLabel(2000), "2 GB/s"))
}

func TestCommitOf(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	tests := []struct {
		name     string
		settings []debug.BuildSetting
		want     string
	}{
		{"no VCS stamp", nil, "unknown"},
		{"clean tree", []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}, rev},
		{"changed tree", []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}, rev + "-dirty"},
		{"modified without revision", []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}, "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, commitOf(tt.settings))
		})
	}
}

// TestIdleTargets: an idle RsockRDMA end meets the targets at 64 KiB all included and
// 32 KiB registered, and misses each alone past it; other transports and footprints
// without a registered count measure nothing.
func TestIdleTargets(t *testing.T) {
	rdma := func(heap, stack, reg float64) workload.IdleResult {
		return workload.IdleResult{Transport: workload.RsockRDMA, Conns: 5000, Ends: 2, HeapPerEnd: heap, StackPerEnd: stack, RegisteredPerEnd: reg}
	}
	tests := []struct {
		name         string
		idle         []workload.IdleResult
		run          bool
		allOK, regOK bool
	}{
		{"at the limits", []workload.IdleResult{rdma(60<<10, 4<<10, 32<<10)}, true, true, true},
		{"stacks tip it over", []workload.IdleResult{rdma(60<<10, 4<<10+1, 12<<10)}, true, false, true},
		{"registered over", []workload.IdleResult{rdma(40<<10, 2<<10, 32<<10+1)}, true, true, false},
		{"TCP only", []workload.IdleResult{{Transport: workload.RawTCP, HeapPerEnd: 4 << 10, RegisteredPerEnd: -1}}, false, false, false},
		{"registered not counted", []workload.IdleResult{rdma(40<<10, 2<<10, -1)}, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := IdleTargets(tt.idle)
			require.Len(t, ts, 2)
			all, reg := ts[0], ts[1]
			require.Equal(t, tt.run, all.Run, "all included measured")
			require.Equal(t, tt.run, reg.Run, "registered measured")
			require.Equal(t, tt.allOK, all.Pass, "all included: %s", all.Measured)
			require.Equal(t, tt.regOK, reg.Pass, "registered: %s", reg.Measured)
		})
	}
}
