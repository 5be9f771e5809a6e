package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// progress shows on standard error how far a run has come: a line per measurement
// with its outcome, the time elapsed and an estimate of the time left; on a terminal,
// also the measurement in progress, updated in place.
type progress struct {
	w       io.Writer
	quiet   bool
	tty     bool
	total   int
	done    int
	t0      time.Time
	label   string
	begun   time.Time
	perRun  time.Duration
	lastLen int
	buf     []byte // what show and update write, reused
}

func newProgress(w io.Writer, quiet bool) *progress {
	p := &progress{w: w, quiet: quiet}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// start announces total measurements of about perRun each.
func (p *progress) start(total int, perRun time.Duration) {
	p.total, p.perRun, p.t0 = total, perRun, time.Now()
	if !p.quiet && perRun > 0 {
		fmt.Fprintf(p.w, "rsockperf: %d measurements of %v each, about %v\n", total, perRun, p.eta())
	}
}

// begin announces a measurement.
func (p *progress) begin(label string) {
	p.label, p.begun = label, time.Now()
	p.show(fmt.Sprintf("%s %s", p.prefix(p.done+1), label))
}

// update shows how far the current measurement is, on a terminal. It runs inside the
// measured loop (workload.Timed calls it every 250 ms), where the process's heap
// allocations count in allocs/op, so it allocates nothing: it formats into buf, and
// not at all off a terminal. (Formatted with fmt, it made four allocations a call,
// quiet or not: 16 a second, more than one per operation for a stream of 1 MiB
// writes on a slow device, which failed its 0 allocs/op target.)
func (p *progress) update(frac float64) {
	if p.quiet || !p.tty {
		return
	}
	b := p.appendClear(p.buf[:0])
	start := len(b)
	b = p.appendPrefix(b, p.done+1)
	b = append(b, ' ')
	b = append(b, p.label...)
	b = append(b, ' ')
	var pct [24]byte // fmt's %3.0f%%
	b = appendPadded(b, strconv.AppendFloat(pct[:0], 100*min(frac, 1), 'f', 0, 64), 3)
	b = append(b, '%')
	p.write(b, len(b)-start)
}

// note shows a remark on the current measurement, on a terminal.
func (p *progress) note(s string) {
	p.show(fmt.Sprintf("%s %s: %s", p.prefix(p.done+1), p.label, s))
}

// end reports the outcome of the current measurement.
func (p *progress) end(outcome string) {
	p.done++
	if p.quiet {
		return
	}
	p.clear()
	left := ""
	if p.done < p.total {
		left = fmt.Sprintf(", ~%v left", p.eta())
	}
	fmt.Fprintf(p.w, "%s %s: %s  (%v elapsed%s)\n", p.prefix(p.done), p.label, outcome, time.Since(p.t0).Round(time.Second), left)
}

// prefix numbers measurement n (from 1) of the total: the one in progress, or, in
// end's line, the one that just ended.
func (p *progress) prefix(n int) string { return string(p.appendPrefix(nil, n)) }

// appendPrefix appends prefix(n) to b: "[%*d/%d]", n as wide as the total.
func (p *progress) appendPrefix(b []byte, n int) []byte {
	var num, total [20]byte
	t := strconv.AppendInt(total[:0], int64(p.total), 10)
	b = append(b, '[')
	b = appendPadded(b, strconv.AppendInt(num[:0], int64(n), 10), len(t))
	b = append(b, '/')
	b = append(b, t...)
	return append(b, ']')
}

// appendPadded appends s to b, right-aligned in width columns.
func appendPadded(b, s []byte, width int) []byte {
	for range width - len(s) {
		b = append(b, ' ')
	}
	return append(b, s...)
}

// eta estimates the time left from the measurements done so far.
func (p *progress) eta() time.Duration {
	left := p.total - p.done
	per := p.perRun
	if p.done > 0 {
		per = time.Since(p.t0) / time.Duration(p.done)
	}
	return (time.Duration(left) * per).Round(time.Second)
}

// show replaces the line in progress with s, on a terminal.
func (p *progress) show(s string) {
	if p.quiet || !p.tty {
		return
	}
	b := p.appendClear(p.buf[:0])
	p.write(append(b, s...), len(s))
}

// write writes b, which ends with a line in progress of n bytes, and keeps b's
// storage for the next line.
func (p *progress) write(b []byte, n int) {
	p.w.Write(b)
	p.buf, p.lastLen = b, n
}

// clear erases the line in progress, on a terminal.
func (p *progress) clear() {
	if b := p.appendClear(p.buf[:0]); len(b) > 0 {
		p.write(b, 0)
	}
}

// appendClear appends to b what erases the line in progress, if any: a carriage
// return, blanks over it and a carriage return.
func (p *progress) appendClear(b []byte) []byte {
	if !p.tty || p.lastLen == 0 {
		return b
	}
	b = append(b, '\r')
	for range p.lastLen {
		b = append(b, ' ')
	}
	return append(b, '\r')
}
