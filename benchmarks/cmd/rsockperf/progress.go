package main

import (
	"fmt"
	"io"
	"os"
	"strings"
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

// update shows how far the current measurement is, on a terminal.
func (p *progress) update(frac float64) {
	p.show(fmt.Sprintf("%s %s %3.0f%%", p.prefix(p.done+1), p.label, 100*min(frac, 1)))
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
func (p *progress) prefix(n int) string {
	width := len(fmt.Sprint(p.total))
	return fmt.Sprintf("[%*d/%d]", width, n, p.total)
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

func (p *progress) show(s string) {
	if p.quiet || !p.tty {
		return
	}
	p.clear()
	fmt.Fprint(p.w, s)
	p.lastLen = len(s)
}

func (p *progress) clear() {
	if p.tty && p.lastLen > 0 {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.lastLen)+"\r")
		p.lastLen = 0
	}
}
