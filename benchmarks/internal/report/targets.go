package report

import (
	"fmt"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// Target is one of the performance targets rsock is held to, checked against a run.
type Target struct {
	Name     string  `json:"name"`
	Measured string  `json:"measured"`
	Value    float64 `json:"value"`
	Limit    float64 `json:"limit"`
	// AtMost tells whether Value must be at most Limit (else at least).
	AtMost bool `json:"at_most"`
	// Run is false when the run did not measure what the target needs.
	Run  bool `json:"run"`
	Pass bool `json:"pass"`
}

// Verdict says whether the target was met and, if not, by how much it was missed.
func (t Target) Verdict() string {
	switch {
	case !t.Run:
		return "not measured"
	case t.Pass:
		return "met"
	case t.Limit == 0:
		return "MISSED"
	case t.AtMost:
		return fmt.Sprintf("MISSED by %.0f%% (%.2f× the limit)", 100*(t.Value/t.Limit-1), t.Value/t.Limit)
	}
	return fmt.Sprintf("MISSED by %.0f%% (%.2f× the limit)", 100*(1-t.Value/t.Limit), t.Value/t.Limit)
}

// Targets checks the performance targets against results.
func Targets(results []Result) []Target {
	get := func(wl, transport string, size, conns int) (Result, bool) {
		for _, r := range results {
			if r.Workload == wl && r.Transport == transport && r.Size == size && (conns == 0 || r.Conns == conns) && r.Err == "" {
				return r, true
			}
		}
		return Result{}, false
	}
	var ts []Target
	// ratioOf checks fig(transport's result) / fig(base's) against limit.
	ratioOf := func(name, wl string, size int, transport, base string, limit float64, atMost bool, fig func(Result) float64) {
		t := Target{Name: name, Limit: limit, AtMost: atMost}
		a, ok1 := get(wl, transport, size, 0)
		b, ok2 := get(wl, base, size, 0)
		if ok1 && ok2 {
			x, y := fig(a), fig(b)
			if y > 0 {
				t.Run = true
				t.Value = x / y
				t.Measured = Ratio(t.Value)
				t.Pass = t.Value >= limit
				if atMost {
					t.Pass = t.Value <= limit
				}
			}
		}
		ts = append(ts, t)
	}
	figure := func(r Result) float64 { v, _ := r.Figure(); return v }
	ratio := func(name, wl string, size int, transport, base string, limit float64, atMost bool) {
		ratioOf(name, wl, size, transport, base, limit, atMost, figure)
	}
	const kib64, mib = 64 << 10, 1 << 20
	// Issue 15's bounds against raw soft verbs, which copies each byte once in one
	// goroutine: a socket copies more, and its two ends hand each message over.
	ratio("RsockRDMA stream 64KiB ≥ 0.5× SoftVerbs", workload.Stream, kib64, workload.RsockRDMA, workload.SoftVerbs, 0.5, false)
	ratio("RsockRDMA stream 1MiB ≥ 0.7× SoftVerbs", workload.Stream, mib, workload.RsockRDMA, workload.SoftVerbs, 0.7, false)
	ratio("RsockRDMA stream 64KiB ≥ 2× RawTCP", workload.Stream, kib64, workload.RsockRDMA, workload.RawTCP, 2, false)
	ratio("RsockRDMA pingpong 64B p50 ≤ 3× SoftVerbs", workload.PingPong, 64, workload.RsockRDMA, workload.SoftVerbs, 3, true)
	ratio("RsockRDMA pingpong 64B p50 ≤ 0.3× RawTCP", workload.PingPong, 64, workload.RsockRDMA, workload.RawTCP, 0.3, true)
	ratio("RsockTCP stream 64KiB ≥ 0.97× RawTCP", workload.Stream, kib64, workload.RsockTCP, workload.RawTCP, 0.97, false)
	ratio("RsockQUIC stream 64KiB ≥ 0.95× RawQUIC", workload.Stream, kib64, workload.RsockQUIC, workload.RawQUIC, 0.95, false)
	ratio("RsockRDMA http tiny ≥ 1.3× RawTCP req/s", workload.HTTP, workload.HTTPTiny, workload.RsockRDMA, workload.RawTCP, 1.3, false)
	ratio("RsockRDMA http 1MiB ≥ 1.3× RawTCP req/s", workload.HTTP, workload.HTTPBig, workload.RsockRDMA, workload.RawTCP, 1.3, false)
	ratio("RsockRDMA grpc ≥ 1.3× RawTCP calls/s", workload.GRPC, 64, workload.RsockRDMA, workload.RawTCP, 1.3, false)
	// Issue 15: connections set up and closed one after the other, per second.
	ratioOf("RsockRDMA setup ≥ 0.5× RawTCP connections/s", workload.Setup, 1, workload.RsockRDMA, workload.RawTCP, 0.5, false,
		func(r Result) float64 { return r.OpsPerSec })

	// Steady-state allocations: rsock's stream and ping-pong allocate nothing of their
	// own. go test prints allocs/op rounded down, so under one per operation is its "0".
	alloc := Target{Name: "0 allocs/op: RsockRDMA and RsockTCP stream and pingpong, every size", AtMost: true, Limit: 1}
	// Over QUIC, quic-go allocates, and a little differently from run to run; rsock
	// must add nothing to that beyond the noise.
	quicAlloc := Target{Name: "RsockQUIC stream and pingpong allocs/op ≤ RawQUIC's + 5%", AtMost: true, Limit: 1.05}
	var worst Result
	for _, r := range results {
		if r.Err != "" || (r.Workload != workload.Stream && r.Workload != workload.PingPong) {
			continue
		}
		switch r.Transport {
		case workload.RsockRDMA, workload.RsockTCP:
			if !alloc.Run || r.AllocsPerOp > worst.AllocsPerOp {
				worst = r
			}
			alloc.Run = true
		case workload.RsockQUIC:
			raw, ok := get(r.Workload, workload.RawQUIC, r.Size, r.Conns)
			if !ok {
				continue
			}
			v := (r.AllocsPerOp + 0.5) / (raw.AllocsPerOp + 0.5)
			if !quicAlloc.Run || v > quicAlloc.Value {
				quicAlloc.Value = v
				quicAlloc.Measured = fmt.Sprintf("worst %s (%s %s: %.3g vs %.3g)", Ratio(v), r.Workload, workload.SizeName(r.Size), r.AllocsPerOp, raw.AllocsPerOp)
			}
			quicAlloc.Run = true
		}
	}
	if alloc.Run {
		alloc.Value = worst.AllocsPerOp
		alloc.Pass = worst.AllocsPerOp < 1
		alloc.Measured = fmt.Sprintf("worst %.3g (%s %s %s)", worst.AllocsPerOp, worst.Transport, worst.Workload, workload.SizeName(worst.Size))
	}
	quicAlloc.Pass = quicAlloc.Run && quicAlloc.Value <= quicAlloc.Limit
	ts = append(ts, alloc, quicAlloc)
	return ts
}

// IdleTargets checks the memory targets of issue 14 against idle footprints: an idle
// RsockRDMA connection end at the defaults costs at most 64 KiB all included (heap,
// which on soft holds the registered memory, and goroutine stacks), and at most 32 KiB
// of it registered (pinned, on a real device).
func IdleTargets(idle []workload.IdleResult) []Target {
	all := Target{Name: "≤ 64 KiB per idle RsockRDMA connection end, all included", AtMost: true, Limit: 64 << 10}
	reg := Target{Name: "≤ 32 KiB registered per idle RsockRDMA connection end", AtMost: true, Limit: 32 << 10}
	for _, r := range idle {
		if r.Transport != workload.RsockRDMA || r.RegisteredPerEnd < 0 {
			continue
		}
		all.Run, reg.Run = true, true
		all.Value = r.HeapPerEnd + r.StackPerEnd
		all.Measured = fmt.Sprintf("%s (%d conns; heap %s, stacks %s)", Bytes(all.Value), r.Conns, Bytes(r.HeapPerEnd), Bytes(r.StackPerEnd))
		all.Pass = all.Value <= all.Limit
		reg.Value = r.RegisteredPerEnd
		reg.Measured = fmt.Sprintf("%s (%d conns)", Bytes(r.RegisteredPerEnd), r.Conns)
		reg.Pass = reg.Value <= reg.Limit
	}
	return []Target{all, reg}
}
