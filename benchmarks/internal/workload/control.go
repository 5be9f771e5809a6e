package workload

import (
	"runtime"
	"slices"
	"time"
)

// Control paces a workload's measurement loop. Next reports whether to run one more
// operation. It is called from one goroutine only: workloads that run many goroutines
// hand out the operations from the goroutine that calls Next.
//
// In a benchmark, Next is testing.B's Loop; in rsockperf it is a [Timed].
type Control interface {
	Next() bool
}

// Timed is a Control that runs operations for Duration (or MaxOps operations, if
// positive, whichever comes first) and measures them: how many, for how long, and the
// heap allocations the process made meanwhile (as testing.B's ReportAllocs counts them:
// every goroutine's).
//
// It looks at the clock only every Stride operations, and adapts Stride so that it does
// so about every 100 µs, so that fast operations are not slowed by the clock.
type Timed struct {
	Duration time.Duration
	MaxOps   int64
	// Progress, if set, is called now and then with the fraction of Duration elapsed.
	Progress func(done float64)

	ops, nextCheck, stride int64
	start, last, end       time.Time
	lastProgress           time.Time
	mem0                   runtime.MemStats
	mallocs, allocBytes    uint64
	done                   bool
}

// Next implements Control.
func (t *Timed) Next() bool {
	if t.done {
		return false
	}
	if t.ops == 0 && t.start.IsZero() {
		runtime.GC()
		runtime.ReadMemStats(&t.mem0)
		t.stride, t.nextCheck = 1, 1
		t.start = time.Now()
		t.last = t.start
	}
	if t.MaxOps > 0 && t.ops >= t.MaxOps {
		t.finish(time.Now())
		return false
	}
	if t.ops >= t.nextCheck {
		now := time.Now()
		if now.Sub(t.start) >= t.Duration {
			t.finish(now)
			return false
		}
		switch since := now.Sub(t.last); {
		case since < 50*time.Microsecond && t.stride < 1<<20:
			t.stride *= 2
		case since > 500*time.Microsecond && t.stride > 1:
			t.stride /= 2
		}
		t.last = now
		t.nextCheck = t.ops + t.stride
		if t.Progress != nil && now.Sub(t.lastProgress) >= 250*time.Millisecond {
			t.lastProgress = now
			t.Progress(float64(now.Sub(t.start)) / float64(t.Duration))
		}
	}
	t.ops++
	return true
}

func (t *Timed) finish(now time.Time) {
	t.end = now
	t.done = true
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	t.mallocs = m.Mallocs - t.mem0.Mallocs
	t.allocBytes = m.TotalAlloc - t.mem0.TotalAlloc
}

// Ops returns how many operations ran.
func (t *Timed) Ops() int64 { return t.ops }

// Elapsed returns how long they took. It is valid once Next has returned false.
func (t *Timed) Elapsed() time.Duration { return t.end.Sub(t.start) }

// AllocsPerOp returns the heap allocations per operation.
func (t *Timed) AllocsPerOp() float64 { return perOp(t.mallocs, t.ops) }

// AllocBytesPerOp returns the bytes allocated per operation.
func (t *Timed) AllocBytesPerOp() float64 { return perOp(t.allocBytes, t.ops) }

func perOp(v uint64, ops int64) float64 {
	if ops == 0 {
		return 0
	}
	return float64(v) / float64(ops)
}

// Metrics are what a workload reports besides the operations its Control counted.
type Metrics struct {
	// BytesPerOp is the payload one operation moves (testing.B's SetBytes), or 0.
	BytesPerOp int64
	// Latency holds percentiles of per-operation latency, for workloads that measure it.
	Latency *Percentiles
}

// Percentiles summarize latency samples.
type Percentiles struct {
	N              int // samples they come from
	P50, P99, P999 time.Duration
}

// recorder keeps the latest samples of a latency in a ring allocated up front, so that
// recording allocates nothing in the measurement loop.
type recorder struct {
	samples []time.Duration
	n       int
}

// maxSamples bounds a recorder's memory: 8 MiB of samples.
const maxSamples = 1 << 20

func newRecorder() *recorder { return &recorder{samples: make([]time.Duration, maxSamples)} }

func (r *recorder) add(d time.Duration) {
	r.samples[r.n%len(r.samples)] = d
	r.n++
}

// percentiles sorts the samples and returns their percentiles, by nearest rank, or nil
// without samples.
func (r *recorder) percentiles() *Percentiles {
	s := r.samples[:min(r.n, len(r.samples))]
	if len(s) == 0 {
		return nil
	}
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return &Percentiles{N: len(s), P50: at(0.50), P99: at(0.99), P999: at(0.999)}
}
