package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/benchmarks/internal/report"
	"github.com/rsockio/rsock/internal/harness"
)

// TestMain fails the package's tests if a goroutine outlives them, once rsock's idle
// devices are closed.
func TestMain(m *testing.M) { harness.VerifyTestMain(m) }

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"64", 64}, {"64B", 64}, {"4KiB", 4096}, {"4K", 4096}, {"1MiB", 1 << 20}, {"2M", 2 << 20},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	if _, err := parseSize("big"); err == nil {
		t.Errorf("parseSize(%q) succeeded", "big")
	}
}

func TestFlags(t *testing.T) {
	var stderr bytes.Buffer
	for _, args := range [][]string{
		{"-mode", "nope"},
		{"-transports", "carrier-pigeon"},
		{"-workloads", "nap"},
		{"-mode", "client"},
		{"-mode", "client", "-addr", "h:1", "-transports", "Pipe"},
		{"-mode", "idle", "-transports", "SoftVerbs"},
		{"-sizes", "0"},
	} {
		if _, err := parseFlags(args, &stderr); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
	o, err := parseFlags([]string{"-short", "-workloads", "conns,http"}, &stderr)
	require.NoError(t, err)
	for _, m := range plan(o) {
		require.LessOrEqual(t, m.p.Conns, shortConns, "%s in -short mode", m.w.Name)
	}
	o, err = parseFlags([]string{"-mode", "idle"}, &stderr)
	require.NoError(t, err)
	require.Equal(t, 5000, o.idleConns)
}

// TestRun runs the command on a few transports and workloads, briefly, and checks its
// outputs. Its 44 measurements (22 results of 2 runs each) are numbered 1 to 44; its
// 12 rounds (6 workloads and sizes, twice) each begin with a cross-core probe, after
// the one at the start.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	jsonOut, svgOut := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.svg")
	var stdout, stderr bytes.Buffer
	code := run([]string{
		"-transports", "SoftVerbs,RsockRDMA,RawTCP,RsockTCP", "-workloads", "stream,pingpong,grpc",
		"-sizes", "64,4KiB", "-duration", "20ms", "-count", "2",
		"-json", jsonOut, "-svg", svgOut,
	}, &stdout, &stderr)
	out := stdout.String()
	for _, want := range []string{"stream:", "pingpong:", "grpc:", "RsockRDMA", "targets:"} {
		require.Contains(t, out, want)
	}
	require.Contains(t, stderr.String(), "[ 1/44] stream 64B SoftVerbs (1/2)", "progress starts at the first measurement")
	require.Equal(t, 1, strings.Count(stderr.String(), "[44/44]"), "progress ends at the last measurement, once: %s", stderr.String())

	b, err := os.ReadFile(jsonOut)
	require.NoError(t, err)
	var rep report.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	// 20 ms runs may miss a target; then, and only then, the exit status says so.
	missed := false
	for _, tg := range rep.Targets {
		missed = missed || (tg.Run && !tg.Pass)
	}
	if missed {
		require.Equal(t, 1, code, "a target was missed; stderr: %s", stderr.String())
		require.Contains(t, stderr.String(), "MISSED")
	} else {
		require.Equal(t, 0, code, "stderr: %s", stderr.String())
	}
	require.NotEqual(t, "unknown", rep.Machine.Commit, "go test runs in the checkout: its commit is recorded")
	require.NotEmpty(t, rep.Machine.GoVersion)
	if runtime.GOMAXPROCS(0) >= 2 {
		require.Contains(t, out, "\ncores:     cross-core round trip ")
		require.Len(t, rep.Machine.CrossCoreRTTNs, 1+12, "a probe at the start and one per round")
	} else {
		require.NotContains(t, out, "cores:", "no probe with one processor")
	}
	// stream and pingpong: 2 sizes × 4 transports; grpc: 2 sizes × 3 transports.
	require.Len(t, rep.Results, 22)
	for _, r := range rep.Results {
		require.Empty(t, r.Err, "%s %d on %s", r.Workload, r.Size, r.Transport)
		require.Equal(t, 2, r.Runs)
	}
	b, err = os.ReadFile(svgOut)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(b), "<svg"))
}

func TestIdleMode(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"-mode", "idle", "-transports", "RsockRDMA,RawTCP", "-conns", "20", "-q"}, &stdout, &stderr)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	require.Contains(t, stdout.String(), "idle:")
	if runtime.GOMAXPROCS(0) >= 2 {
		require.Regexp(t, `\ncores:     cross-core round trip [\d.]+[nµm]?s \(one probe\)\n`, stdout.String(), "idle mode probes once")
	}
	// At the defaults an end registers an 8 KiB ring, its 64-byte mailbox and 4 KiB of
	// staging.
	require.Contains(t, stdout.String(), "12.1 KiB", "registered memory per RsockRDMA end")
	require.Regexp(t, `≤ 32 KiB registered per idle RsockRDMA connection end .* met\n`, stdout.String())
	require.Regexp(t, `≤ 64 KiB per idle RsockRDMA connection end, all included .* met\n`, stdout.String())
}

// TestMissedTargetFails: a report with a target missed is an error (rsockperf exits
// 1), one with every target met or not measured is not.
func TestMissedTargetFails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		targets []report.Target
		fails   bool
	}{
		{"met", []report.Target{{Name: "a", Run: true, Pass: true}}, false},
		{"not measured", []report.Target{{Name: "a"}}, false},
		{"missed", []report.Target{{Name: "a", Run: true, Pass: true}, {Name: "b ≥ 2×", Run: true, Value: 1, Limit: 2}}, true},
	} {
		var stdout bytes.Buffer
		err := write(&options{}, &report.Report{Targets: tc.targets}, &stdout)
		if (err != nil) != tc.fails {
			t.Errorf("write with targets %s: error %v, want one: %v", tc.name, err, tc.fails)
		}
		if tc.fails {
			require.ErrorContains(t, err, "b ≥ 2×: MISSED by 50%")
		}
	}
}

// TestProgressNumbers: the lines number the measurements 1 to total, each once.
func TestProgressNumbers(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, false)
	p.start(3, 0)
	for _, label := range []string{"one", "two", "three"} {
		p.begin(label)
		p.end("ok")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3, "output: %s", buf.String())
	for i, want := range []string{"[1/3] one: ok", "[2/3] two: ok", "[3/3] three: ok"} {
		require.True(t, strings.HasPrefix(lines[i], want), "line %d = %q, want it to start with %q", i, lines[i], want)
	}
}
