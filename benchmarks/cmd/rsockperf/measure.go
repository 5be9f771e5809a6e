package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/rsockio/rsock/benchmarks/internal/report"
	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// shortConns caps the conns workload's connection count in -short mode.
const shortConns = 64

// measurement is one workload with one set of parameters, to run on several transports.
type measurement struct {
	w workload.Workload
	p workload.Params
}

// plan lists the measurements o asks for, in table order.
func plan(o *options) []measurement {
	var ms []measurement
	for _, w := range o.workloads {
		sizes, conns := w.Sizes, w.Conns
		if len(o.sizes) > 0 && w.Name != workload.Setup {
			sizes = o.sizes
		}
		takesConns := w.Name == workload.Conns || w.Name == workload.HTTP || w.Name == workload.GRPC
		if len(o.conns) > 0 && takesConns {
			conns = o.conns
		}
		if o.short && w.Name == workload.Conns && len(o.conns) == 0 {
			conns = nil
			for _, c := range w.Conns {
				conns = append(conns, min(c, shortConns))
			}
		}
		for _, s := range sizes {
			for _, c := range conns {
				ms = append(ms, measurement{w, workload.Params{Size: s, Conns: c}})
			}
		}
	}
	return ms
}

// measure runs the workloads (or, in idle mode, the footprint) and writes the report.
// It probes the cross-core round trip (report.CrossCoreRoundTrip) when it starts and,
// for workloads, before each round of measurements, and notes when the probes disagree.
func measure(o *options, stdout, stderr io.Writer) error {
	rep := &report.Report{
		Command:  o.command,
		Machine:  report.ThisMachine(),
		Started:  time.Now(),
		Duration: o.duration.String(),
		Count:    o.count,
	}
	rep.Machine.ProbeCrossCore()
	envs := map[string]*workload.Env{}
	defer func() {
		for _, e := range envs {
			e.Close()
		}
	}()
	envFor := func(i int, t workload.Transport) (*workload.Env, error) {
		if e := envs[t.Name]; e != nil {
			return e, nil
		}
		var e *workload.Env
		var err error
		if o.mode == "client" {
			addr, aerr := transportAddr(o.addr, i, t)
			if aerr != nil {
				return nil, aerr
			}
			opts := o.topts
			opts.InsecureTLS = true
			e, err = workload.Connect(t, addr, opts)
		} else {
			e, err = workload.Start(t, o.topts)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		envs[t.Name] = e
		return e, nil
	}
	prog := newProgress(stderr, o.quiet)
	if o.mode == "client" {
		rep.Notes = append(rep.Notes, "allocs/op are the client process's; the server runs in another process")
	}

	if o.mode == "idle" {
		prog.start(len(o.transports), 0)
		for i, t := range o.transports {
			env, err := envFor(i, t)
			if err != nil {
				return err
			}
			prog.begin(fmt.Sprintf("idle %d × %s", o.idleConns, t.Name))
			r, err := workload.Idle(env, o.idleConns, func(n int) { prog.note(fmt.Sprintf("%d/%d open", n, o.idleConns)) })
			if err != nil {
				return fmt.Errorf("idle %s: %w", t.Name, err)
			}
			prog.end(fmt.Sprintf("%s heap/end, %s registered/end", report.Bytes(r.HeapPerEnd), regText(r)))
			rep.Idle = append(rep.Idle, r)
			env.Close()
			delete(envs, t.Name)
		}
		rep.Targets = report.IdleTargets(rep.Idle)
		return write(o, rep, stdout)
	}

	ms := plan(o)
	type key struct {
		workload    string
		size, conns int
		transport   string
	}
	runs := map[key][]report.Run{}
	var order []key
	total := 0
	for _, m := range ms {
		for _, t := range o.transports {
			if m.w.Runs(t) {
				total += o.count
			}
		}
	}
	prog.start(total, o.duration)
	for _, m := range ms {
		if !slices.ContainsFunc(o.transports, m.w.Runs) {
			continue // no round, no probe
		}
		for c := range o.count {
			// Each round's probe says which placement of the processors it ran in.
			rep.Machine.ProbeCrossCore()
			for i, t := range o.transports {
				if !m.w.Runs(t) {
					continue
				}
				k := key{m.w.Name, m.p.Size, m.p.Conns, t.Name}
				if c == 0 {
					order = append(order, k)
				}
				label := fmt.Sprintf("%s %s %s", m.w.Name, report.ParamLabel(m.w, m.p.Size, m.p.Conns), t.Name)
				if o.count > 1 {
					label += fmt.Sprintf(" (%d/%d)", c+1, o.count)
				}
				prog.begin(label)
				r := runOne(o, m, t, func() (*workload.Env, error) { return envFor(i, t) }, prog.update)
				prog.end(summary(m.w, r))
				runs[k] = append(runs[k], r)
			}
		}
	}
	for _, k := range order {
		rep.Results = append(rep.Results, report.Merge(runs[k]))
	}
	report.Compare(rep.Results)
	rep.Targets = report.Targets(rep.Results)
	if n := rep.Machine.CrossCoreNote(); n != "" {
		rep.Notes = append(rep.Notes, n)
	}
	return write(o, rep, stdout)
}

// runOne measures m on t once.
func runOne(o *options, m measurement, t workload.Transport, env func() (*workload.Env, error), progress func(float64)) report.Run {
	r := report.Run{Workload: m.w.Name, Transport: t.Name, Size: m.p.Size, Conns: m.p.Conns}
	e, err := env()
	if err != nil {
		r.Err = err
		return r
	}
	ctl := &workload.Timed{Duration: o.duration, Progress: progress}
	r.Metrics, r.Err = m.w.Run(ctl, e, m.p)
	r.Ops, r.Elapsed = ctl.Ops(), ctl.Elapsed()
	r.AllocsPerOp, r.AllocBytesPerOp = ctl.AllocsPerOp(), ctl.AllocBytesPerOp()
	return r
}

// summary is the one-line outcome of a run, for the progress display.
func summary(w workload.Workload, r report.Run) string {
	if r.Err != nil {
		return "error: " + r.Err.Error()
	}
	res := report.Merge([]report.Run{r})
	switch w.Figure {
	case "MB/s":
		return report.Num(res.MBPerSec) + " MB/s"
	case "p50":
		return "p50 " + report.Nanos(res.P50) + ", p99 " + report.Nanos(res.P99)
	}
	return report.Num(res.OpsPerSec) + " ops/s"
}

func regText(r workload.IdleResult) string {
	if r.RegisteredPerEnd < 0 {
		return "-"
	}
	return report.Bytes(r.RegisteredPerEnd)
}

// write prints the report and writes the files asked for.
func write(o *options, rep *report.Report, stdout io.Writer) error {
	var errs []error
	if err := rep.WriteText(stdout); err != nil {
		errs = append(errs, err)
	}
	if o.jsonOut != "" {
		errs = append(errs, writeFile(o.jsonOut, rep.WriteJSON))
	}
	if o.svgOut != "" {
		errs = append(errs, writeFile(o.svgOut, rep.WriteSVG))
	}
	for _, r := range rep.Results {
		if r.Err != "" {
			errs = append(errs, fmt.Errorf("%s %s on %s failed: %s", r.Workload, workload.SizeName(r.Size), r.Transport, r.Err))
		}
	}
	for _, t := range rep.Targets {
		if t.Run && !t.Pass {
			errs = append(errs, fmt.Errorf("target %s: %s", t.Name, t.Verdict()))
		}
	}
	return errors.Join(errs...)
}

func writeFile(name string, write func(io.Writer) error) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	return f.Close()
}
