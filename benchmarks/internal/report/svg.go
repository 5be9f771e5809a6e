package report

import (
	"bufio"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/rsockio/rsock/benchmarks/internal/workload"
)

// Series is one line of a plot.
type Series struct {
	Name   string
	Points []Point
	Color  string // an SVG color; "" picks one
	Dashed bool
}

// Point is a plotted value.
type Point struct{ X, Y float64 }

// WriteSVG plots the stream workload's throughput against write size, one line per
// transport, on logarithmic axes: rsock's lines solid, the others dashed, each rsock
// transport in the color of the raw one it builds on.
func (r *Report) WriteSVG(w io.Writer) error {
	var series []Series
	for _, t := range workload.Transports() {
		s := Series{Name: t.Name, Color: colors[t.Name], Dashed: !strings.HasPrefix(t.Name, "Rsock")}
		for _, res := range r.Results {
			if res.Workload == workload.Stream && res.Transport == t.Name && res.Err == "" && res.MBPerSec > 0 {
				s.Points = append(s.Points, Point{float64(res.Size), res.MBPerSec})
			}
		}
		if len(s.Points) > 0 {
			slices.SortFunc(s.Points, func(a, b Point) int { return int(math.Copysign(1, a.X-b.X)) })
			series = append(series, s)
		}
	}
	if len(series) == 0 {
		return errors.New("no stream results to plot")
	}
	title := fmt.Sprintf("One-way stream throughput by write size (%s, %d CPUs, %s)", r.Machine.CPU, r.Machine.NumCPU, r.Started.Format("2006-01-02"))
	return PlotSVG(w, title, series)
}

// colors gives each kind of transport one color: the raw transport's line is dashed,
// rsock's over it solid.
var colors = map[string]string{
	workload.SoftVerbs: "#d62728", workload.RsockRDMA: "#d62728", workload.SoftVerbs3Copy: "#9467bd",
	workload.RawTCP: "#1f77b4", workload.RsockTCP: "#1f77b4",
	workload.RawQUIC: "#2ca02c", workload.RsockQUIC: "#2ca02c",
	workload.Unix: "#7f7f7f", workload.Pipe: "#ff7f0e",
}

// palette colors series that have none.
var palette = []string{"#9467bd", "#8c564b", "#17becf", "#e377c2", "#bcbd22"}

// PlotSVG draws series on a log-log plot of MB/s against bytes, with a legend.
func PlotSVG(out io.Writer, title string, series []Series) error {
	const (
		width, height       = 900, 520
		left, right         = 96, 150 // plot margins; the legend sits in the right one
		top, bottom         = 50, 60
		plotW, plotH        = width - left - right, height - top - bottom
		fontFamily          = "font-family=\"Helvetica, Arial, sans-serif\""
		axisColor, gridGrey = "#333", "#ddd"
	)
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	var xs []float64
	for _, s := range series {
		for _, p := range s.Points {
			xmin, xmax = min(xmin, p.X), max(xmax, p.X)
			ymin, ymax = min(ymin, p.Y), max(ymax, p.Y)
			if !slices.Contains(xs, p.X) {
				xs = append(xs, p.X)
			}
		}
	}
	slices.Sort(xs)
	if xmin == xmax {
		xmin, xmax = xmin/2, xmax*2
	}
	lx0, lx1 := math.Log2(xmin), math.Log2(xmax)
	ly0, ly1 := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
	if ly0 == ly1 {
		ly1++
	}
	px := func(x float64) float64 { return left + (math.Log2(x)-lx0)/(lx1-lx0)*plotW }
	py := func(y float64) float64 { return top + plotH - (math.Log10(y)-ly0)/(ly1-ly0)*plotH }

	w := bufio.NewWriter(out)
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s font-size="12">`+"\n", width, height, width, height, fontFamily)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(w, `<text x="%d" y="24" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))

	// Grid and y labels: decades, with lighter lines at 2× and 5×.
	for d := ly0; d <= ly1; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > ly1+1e-9 {
				break
			}
			y := py(v)
			stroke, dash := gridGrey, ` stroke-dasharray="2,3"`
			if m == 1 {
				dash = ""
				fmt.Fprintf(w, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-8, y, throughputLabel(v))
			}
			fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"%s/>`+"\n", left, y, left+plotW, y, stroke, dash)
		}
	}
	// Grid and x labels: the sizes measured.
	for _, x := range xs {
		X := px(x)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`+"\n", X, top, X, top+plotH, gridGrey)
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", X, top+plotH+18, workload.SizeName(int(x)))
	}
	// Axes and their titles.
	fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="%s"/>`+"\n", left, top, plotW, plotH, axisColor)
	fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="middle">write size (log scale)</text>`+"\n", left+plotW/2, height-18)
	fmt.Fprintf(w, `<text x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">throughput, 10⁶ bytes/s (log scale)</text>`+"\n", top+plotH/2, top+plotH/2)

	// Lines, points and legend.
	for i, s := range series {
		color := s.Color
		if color == "" {
			color = palette[i%len(palette)]
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6,4"`
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="`, color, dash)
		for j, p := range s.Points {
			if j > 0 {
				w.WriteByte(' ')
			}
			fmt.Fprintf(w, "%.1f,%.1f", px(p.X), py(p.Y))
		}
		w.WriteString("\"/>\n")
		for _, p := range s.Points {
			fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s %s: %s MB/s</title></circle>`+"\n",
				px(p.X), py(p.Y), color, html.EscapeString(s.Name), workload.SizeName(int(p.X)), Num(p.Y))
		}
		ly := top + 10 + 22*i
		lx := left + plotW + 16
		fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly, lx+28, ly, color, dash)
		fmt.Fprintf(w, `<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", lx+36, ly, html.EscapeString(s.Name))
	}
	w.WriteString("</svg>\n")
	return w.Flush()
}

// throughputLabel spells a throughput in 10^6 bytes per second for an axis.
func throughputLabel(mbps float64) string {
	switch {
	case mbps >= 1000:
		return fmt.Sprintf("%g GB/s", mbps/1000)
	case mbps >= 1:
		return fmt.Sprintf("%g MB/s", mbps)
	}
	return fmt.Sprintf("%g kB/s", mbps*1000)
}
