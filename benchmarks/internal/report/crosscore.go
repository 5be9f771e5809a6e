package report

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
)

// The probe's size: probeBatches batches of probeRoundTrips round trips each, a batch
// cut short after probeBatchTime (checked every probeClockEvery round trips, and after
// every round trip that had to yield), so that a probe takes 10–40 ms on a machine with
// two free processors and at most about probeBatches × probeBatchTime on any other. A
// spinner yields its processor after probeSpinLimit loads that saw no change.
const (
	probeBatches    = 5
	probeRoundTrips = 20_000
	probeBatchTime  = 25 * time.Millisecond
	probeClockEvery = 256
	probeSpinLimit  = 1 << 16
)

// probeStop is what the timing side stores to let the echoing side go.
const probeStop = -1

// CrossCoreRoundTrip measures how long it takes two goroutines, each locked to its own
// OS thread, to hand a counter back and forth through one atomic: one stores an odd
// value, the other answers with the next even one. It returns the time per round trip
// of the median of a few short batches, or 0 when GOMAXPROCS is below 2, where the two
// spinners would share one processor and time the scheduler instead.
//
// rsockperf records it because the figure is not fixed on a cloud VM: the host places
// the two vCPUs of the project's machines close together or far apart, and moves them
// over minutes. A round trip then costs about 80 ns or about 360 ns, figures that hand
// data between cores slow down in the far mode, while single-goroutine baselines such
// as SoftVerbs barely move, so ratios measured in the two modes are not comparable.
//
// The probe is bounded: a spinner that has seen no change for a long time yields its
// processor, and a batch ends after probeBatchTime however few round trips it made, so
// that a loaded machine, or one with fewer free processors than GOMAXPROCS, still
// finishes within about a tenth of a second. There the figure is tens of microseconds
// (~50 µs on the project's VMs while another process kept one vCPU busy): the two
// spinners share a processor and each round trip waits for a yield. The echoing
// goroutine has returned when CrossCoreRoundTrip does.
func CrossCoreRoundTrip() time.Duration {
	if runtime.GOMAXPROCS(0) < 2 {
		return 0
	}
	l := new(probeLine)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		l.echo()
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	perRoundTrip := make([]time.Duration, probeBatches)
	var v int64 // the last even value, the echo's answer
	for b := range perRoundTrip {
		perRoundTrip[b], v = l.batch(v)
	}
	l.v.Store(probeStop)
	<-done
	slices.Sort(perRoundTrip)
	return perRoundTrip[len(perRoundTrip)/2]
}

// probeLine is the probe's atomic on a cache line of its own (a 128-byte object is
// 128-byte aligned), so that no other variable's writes move that line and get timed.
type probeLine struct {
	v atomic.Int64
	_ [120]byte
}

// batch times up to probeRoundTrips round trips, from v, the last value the echo
// stored, and returns the time per round trip and the echo's last value.
func (l *probeLine) batch(v int64) (time.Duration, int64) {
	t0 := time.Now()
	n := 0
	for n < probeRoundTrips {
		l.v.Store(v + 1)
		var yielded bool
		v, yielded = l.awaitChange(v + 1)
		n++
		if (yielded || n%probeClockEvery == 0) && time.Since(t0) > probeBatchTime {
			break
		}
	}
	return time.Since(t0) / time.Duration(n), v
}

// echo answers every odd value with the next even one until it reads probeStop.
func (l *probeLine) echo() {
	for last := int64(0); ; {
		v, _ := l.awaitChange(last)
		if v == probeStop {
			return
		}
		last = v + 1
		l.v.Store(last)
	}
}

// awaitChange spins until the line holds something other than old and returns it, and
// whether it yielded. It yields its processor after probeSpinLimit loads without a
// change, so that a spinner whose partner is not running lets it run rather than spin
// out the OS's time slice.
func (l *probeLine) awaitChange(old int64) (v int64, yielded bool) {
	for spins := 0; ; spins++ {
		if v = l.v.Load(); v != old {
			return v, yielded
		}
		if spins == probeSpinLimit {
			runtime.Gosched()
			spins, yielded = 0, true
		}
	}
}

// ProbeCrossCore measures the cross-core round trip (CrossCoreRoundTrip) and records
// it in m.CrossCoreRTTNs; with GOMAXPROCS below 2 it records nothing.
func (m *Machine) ProbeCrossCore() {
	if d := CrossCoreRoundTrip(); d > 0 {
		m.CrossCoreRTTNs = append(m.CrossCoreRTTNs, d.Nanoseconds())
	}
}

// crossCoreRange returns the median, smallest and largest of m's probes; ok is false
// when there are none.
func (m Machine) crossCoreRange() (median, lo, hi int64, ok bool) {
	if len(m.CrossCoreRTTNs) == 0 {
		return 0, 0, 0, false
	}
	s := slices.Sorted(slices.Values(m.CrossCoreRTTNs))
	return s[len(s)/2], s[0], s[len(s)-1], true
}

// crossCoreLine is the text header's cores line, without its label, or "" when m has
// no probes.
func (m Machine) crossCoreLine() string {
	median, lo, hi, ok := m.crossCoreRange()
	if !ok {
		return ""
	}
	if n := len(m.CrossCoreRTTNs); n > 1 {
		return fmt.Sprintf("cross-core round trip %s (%s–%s over %d probes)", nanos(median), nanos(lo), nanos(hi), n)
	}
	return fmt.Sprintf("cross-core round trip %s (one probe)", nanos(median))
}

// CrossCoreNote returns a note for the report when m's probes disagree, the largest
// more than twice the smallest: the host moved the processors during the run (or
// another process was busy on one), and figures from the different modes do not
// compare. It returns "" when they agree.
func (m Machine) CrossCoreNote() string {
	_, lo, hi, ok := m.crossCoreRange()
	if !ok || hi <= 2*lo {
		return ""
	}
	return fmt.Sprintf("the cross-core round trip changed during the run (%s–%s): the host moved the "+
		"processors apart or together, or another process took one, and figures and ratios measured in "+
		"the different modes are not comparable", nanos(lo), nanos(hi))
}

// nanos formats a probe as the tables format durations (Nanos).
func nanos(ns int64) string { return Nanos(float64(ns)) }
