package report

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// WriteText writes the report as tables: the machine, one table per workload with
// every figure and its ratios, the idle footprint, and the targets.
func (r *Report) WriteText(out io.Writer) error {
	var b bytes.Buffer
	r.writeText(&b)
	// Aligned columns leave spaces at the ends of lines.
	for line := range strings.Lines(b.String()) {
		if _, err := io.WriteString(out, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

func (r *Report) writeText(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "rsockperf: %s\n", r.Command)
	fmt.Fprintf(w, "machine:   %s, %d CPUs (GOMAXPROCS %d), %s/%s, kernel %s, %s\n",
		m.CPU, m.NumCPU, m.GOMAXPROCS, m.GOOS, m.GOARCH, m.Kernel, m.GoVersion)
	if cores := m.crossCoreLine(); cores != "" {
		fmt.Fprintf(w, "cores:     %s\n", cores)
	}
	fmt.Fprintf(w, "commit:    %s\n", m.Commit)
	if len(r.Results) > 0 {
		fmt.Fprintf(w, "runs:      %s each, median of %d\n", r.Duration, r.Count)
	}
	for _, wl := range workload.Workloads() {
		var rows []Result
		for _, res := range r.Results {
			if res.Workload == wl.Name {
				rows = append(rows, res)
			}
		}
		if len(rows) > 0 {
			fmt.Fprintln(w)
			writeWorkload(w, wl, rows)
		}
	}
	if len(r.Idle) > 0 {
		fmt.Fprintln(w)
		writeIdle(w, r.Idle)
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(w)
		writeTargets(w, r.Targets)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func writeWorkload(w io.Writer, wl workload.Workload, rows []Result) {
	better := "higher is better"
	figure := wl.Figure
	latency := wl.Figure == "p50"
	if latency {
		better, figure = "lower is better", "p50"
	}
	fmt.Fprintf(w, "%s: %s\n  figure: %s, %s; ratios are this/baseline\n", wl.Name, wl.Desc, figure, better)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"params", "transport", figure}
	if latency {
		// ops/s too: for setup, connections per second, dial to close, one at a time.
		head = append(head, "p99", "p999", "ops/s")
	} else if wl.Figure == "MB/s" {
		head = append(head, "ops/s")
	}
	head = append(head, "allocs/op", "spread", "vs baseline", "", "vs RawTCP")
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	last := ""
	for _, r := range rows {
		param := ParamLabel(wl, r.Size, r.Conns)
		label := param
		if param == last {
			label = ""
		}
		last = param
		cells := []string{label, r.Transport}
		if r.Err != "" {
			cells = append(cells, "error: "+r.Err)
			fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
			continue
		}
		v, _ := r.Figure()
		if latency {
			cells = append(cells, Nanos(v), Nanos(r.P99), Nanos(r.P999), Num(r.OpsPerSec))
		} else {
			cells = append(cells, Num(v))
			if wl.Figure == "MB/s" {
				cells = append(cells, Num(r.OpsPerSec))
			}
		}
		cells = append(cells, allocs(r.AllocsPerOp), spread(r))
		if r.Baseline != "" && r.VsBaseline > 0 {
			cells = append(cells, Ratio(r.VsBaseline), r.Baseline)
		} else {
			cells = append(cells, "", "")
		}
		if r.VsTCP > 0 && r.Transport != workload.RawTCP {
			cells = append(cells, Ratio(r.VsTCP))
		} else {
			cells = append(cells, "")
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	tw.Flush()
}

func writeIdle(w io.Writer, rows []workload.IdleResult) {
	fmt.Fprintln(w, "idle: footprint of idle connections, per connection end (heap after GC; on verbs/soft it includes the registered memory)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transport\tconns\tends\theap/end\tregistered/end\theap-registered/end\tstacks/end\tfiles/end\tgoroutines/end\topened in\t")
	for _, r := range rows {
		reg, rest := "-", Bytes(r.HeapPerEnd)
		if r.RegisteredPerEnd >= 0 {
			reg = Bytes(r.RegisteredPerEnd)
			rest = Bytes(r.HeapPerEnd - r.RegisteredPerEnd)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t\n", r.Transport, r.Conns, r.Ends,
			Bytes(r.HeapPerEnd), reg, rest, Bytes(r.StackPerEnd), r.FilesPerEnd, r.GoroutinesPerEnd, r.Setup.Round(time.Millisecond))
	}
	tw.Flush()
	for _, r := range rows {
		if r.Capped != "" {
			fmt.Fprintf(w, "  fewer connections than asked: %s\n", r.Capped)
		}
	}
}

func writeTargets(w io.Writer, ts []Target) {
	fmt.Fprintln(w, "targets:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	unmeasured := 0
	for _, t := range ts {
		if !t.Run {
			unmeasured++
			continue
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", t.Name, t.Measured, t.Verdict())
	}
	tw.Flush()
	if unmeasured > 0 {
		fmt.Fprintf(w, "  (%d more not measured by this run)\n", unmeasured)
	}
}

// ParamLabel spells a workload's parameters as a table shows them.
func ParamLabel(wl workload.Workload, size, conns int) string {
	switch wl.Name {
	case workload.Setup:
		return "-"
	case workload.Conns:
		return fmt.Sprintf("%d×%s", conns, workload.SizeName(size))
	case workload.HTTP, workload.GRPC:
		return fmt.Sprintf("%s, %d callers", workload.SizeName(size), conns)
	}
	return workload.SizeName(size)
}

// Num formats a figure with three significant digits or more.
func Num(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// Nanos formats nanoseconds as a duration.
func Nanos(ns float64) string {
	switch {
	case ns <= 0:
		return "-"
	case ns < 1e3:
		return fmt.Sprintf("%.0fns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.3gµs", ns/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.3gms", ns/1e6)
	}
	return fmt.Sprintf("%.3gs", ns/1e9)
}

// Ratio formats a ratio.
func Ratio(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.1f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

// Bytes formats a byte count in binary units.
func Bytes(v float64) string {
	switch a := max(v, -v); {
	case a >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case a >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

func allocs(v float64) string {
	if v < 0.01 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func spread(r Result) string {
	if r.Runs < 2 {
		return ""
	}
	return fmt.Sprintf("±%.0f%%", 50*r.Spread)
}
