package sim

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/tollgate/tollgate"
)

// Chart geometry, in SVG user units (pixels at 100%).
const (
	chartWidth  = 960
	marginLeft  = 48
	marginRight = 16
	headerH     = 70 // title, subtitle, legend
	panelTitleH = 18
	plotH       = 84
	panelGap    = 16
	footerH     = 30 // the time axis's labels
	plotW       = chartWidth - marginLeft - marginRight
)

// colors gives each algorithm its colour in every chart.
var colors = map[tollgate.Algorithm]string{
	tollgate.TokenBucket:          "#1f77b4",
	tollgate.GCRA:                 "#17becf",
	tollgate.FixedWindow:          "#d62728",
	tollgate.SlidingWindowLog:     "#2ca02c",
	tollgate.SlidingWindowCounter: "#9467bd",
	tollgate.LeakyBucket:          "#ff7f0e",
}

// WriteSVG draws rep as an SVG chart: one panel per algorithm, each with
// the requests offered (grey bars) and admitted (coloured bars; a shaping
// leaky bucket's when they leave its queue) per bin of time, and a line of
// how many were admitted in the last period — what the limit promises to
// keep at or below its rate (dashed). The line's peak is the table's "most
// in any period". A bin of 0 means a tenth of the period, or for traffic
// too long for that (over 896 tenths of a period) the shortest round
// duration (1, 2 or 5 × a power of ten, then seconds, minutes, hours and
// days) that gives each bar a pixel of its own. A bin asked for may give
// up to two bars a pixel. A bar of a bin longer than the period shows the
// bin's mean per period rather than its count, so that bars, line and
// limit share one scale. Every panel has the same scales, so the panels
// compare at a glance.
func WriteSVG(w io.Writer, rep Report, bin time.Duration) error {
	l := rep.Config.Limit
	tr := rep.Traffic
	span := tr.Span
	for _, r := range rep.Results {
		if n := len(r.Leaves); n > 0 && r.Leaves[n-1] >= span {
			span = r.Leaves[n-1] + time.Microsecond
		}
	}
	bin, per, bins, err := chartBins(l.Period, span, bin)
	if err != nil {
		return err
	}
	span = time.Duration(bins) * bin // the chart ends on a bin's edge
	scale := float64(per) / float64(bin)
	offered := histogram(tr.Times, bin, bins)
	top := l.Rate
	for _, c := range offered {
		top = max(top, int(math.Ceil(float64(c)*scale)))
	}
	for _, r := range rep.Results {
		top = max(top, r.MaxInPeriod)
	}
	top = niceCeil(float64(top) * 1.1)

	c := chart{
		Width:  chartWidth,
		Height: headerH + len(rep.Results)*(panelTitleH+plotH+panelGap) + footerH,
		Left:   marginLeft,
		Right:  marginLeft + plotW,
		PlotW:  plotW,
		PlotH:  plotH,
		Title:  fmt.Sprintf("%s: %s", tr.Name, tr.Description),
		Subtitle: fmt.Sprintf("Limit: %s. %d requests over %s; %severy panel on the same scale.",
			limitText(rep.Config), len(tr.Times), short(span), meanText(per, bin)),
		Top:      strconv.Itoa(top),
		Rate:     strconv.Itoa(l.Rate),
		BinText:  short(per),
		LastText: short(l.Period),
		Limit:    fmt.Sprintf("%d per %s", l.Rate, short(l.Period)),
	}
	xOf := func(t time.Duration) float64 { return marginLeft + float64(plotW)*float64(t)/float64(span) }
	yOf := func(v int) float64 { return plotH * (1 - float64(v)/float64(top)) }
	hOf := func(n int) float64 { return plotH * (1 - float64(n)*scale/float64(top)) } // a bar's top
	ts := ticks(span)
	for _, t := range ts {
		c.Ticks = append(c.Ticks, tick{X: px(xOf(t)), Label: tickText(t, ts)})
	}
	y := float64(headerH)
	for _, r := range rep.Results {
		p := panel{
			Y:      px(y),
			PlotY:  px(y + panelTitleH),
			Color:  colors[r.Limit.Algorithm],
			Name:   algorithmName(r),
			LimitY: px(yOf(l.Rate)),
			Stats: fmt.Sprintf("admitted %d of %d (%s vs an exact log) · most in any %s: %d · over the limit: %d · denied with room: %s",
				r.Admitted, r.Admitted+r.Denied, vsLog(r), short(l.Period), r.MaxInPeriod, r.Over, underText(r)),
		}
		if r.MaxDelay > 0 {
			p.Stats += fmt.Sprintf(" · waits ≤ %s", short(r.MaxDelay.Round(time.Millisecond)))
		}
		p.Offered = bars(offered, bin, xOf, hOf)
		p.Admitted = bars(histogram(r.Leaves, bin, bins), bin, xOf, hOf)
		p.Window = rolling(r.Leaves, l.Period, span, xOf, yOf)
		c.Panels = append(c.Panels, p)
		y += panelTitleH + plotH + panelGap
	}
	c.AxisY = px(y - panelGap + 14)

	var buf bytes.Buffer
	if err := chartTemplate.Execute(&buf, c); err != nil {
		return fmt.Errorf("sim: chart: %w", err)
	}
	_, err = w.Write(buf.Bytes())
	return err
}

type chart struct {
	Width, Height, Left, Right, PlotW, PlotH int
	Title, Subtitle, Top, Rate               string
	BinText, LastText, Limit                 string
	Ticks                                    []tick
	Panels                                   []panel
	AxisY                                    string
}

type tick struct{ X, Label string }

type panel struct {
	Y, PlotY, Color, Name, Stats, LimitY string
	Offered, Admitted, Window            string // SVG path data
}

// chartBins returns the chart's bin (bin, or when 0 defaultBin's), how
// many of them span takes, and what a bar counts per: the bin, or the
// period when the bin is longer, the bar then showing the bin's mean per
// period so that it compares with the line and the limit.
func chartBins(period, span, bin time.Duration) (_, per time.Duration, bins int, _ error) {
	if bin <= 0 {
		bin = defaultBin(period, span)
	}
	if bin <= 0 {
		return 0, 0, 0, fmt.Errorf("sim: chart: bin must be positive, got %v", bin)
	}
	bins = int((span + bin - 1) / bin)
	if bins > 2*plotW {
		return 0, 0, 0, fmt.Errorf("sim: chart: %v in bins of %v is %d bins, more than the chart's %d pixels can show at two a pixel; use a longer bin", span, bin, bins, plotW)
	}
	return bin, min(bin, period), bins, nil
}

// meanText says, for the subtitle, what a bar shows when it is a mean.
func meanText(per, bin time.Duration) string {
	if per == bin {
		return ""
	}
	return fmt.Sprintf("bars: the mean per %s of each %s; ", short(per), short(bin))
}

// defaultBin is the chart's bin when none is asked for: a tenth of the
// period, unless that makes more bars than the plot has pixels; then the
// shortest round duration that does not.
func defaultBin(period, span time.Duration) time.Duration {
	bin := period / 10
	least := (span + plotW - 1) / plotW // the shortest bin with a pixel a bar
	if bin >= least {
		return bin
	}
	for _, s := range roundSteps() {
		if s >= least {
			return s
		}
	}
	return (least + 24*time.Hour - 1) / (24 * time.Hour) * (24 * time.Hour) // whole days
}

// roundSteps are the round durations bins and the time axis's labels
// take, shortest first: 1, 2 and 5 × a power of ten up to half a second,
// then whole seconds, minutes, hours and days.
func roundSteps() []time.Duration {
	var steps []time.Duration
	for p := time.Microsecond; p < time.Second; p *= 10 {
		steps = append(steps, p, 2*p, 5*p)
	}
	steps = append(steps,
		time.Second, 2*time.Second, 5*time.Second, 10*time.Second, 15*time.Second, 30*time.Second,
		time.Minute, 2*time.Minute, 5*time.Minute, 10*time.Minute, 15*time.Minute, 30*time.Minute,
		time.Hour, 2*time.Hour, 3*time.Hour, 6*time.Hour, 12*time.Hour)
	for _, d := range []time.Duration{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000} {
		steps = append(steps, d*24*time.Hour)
	}
	return steps
}

// histogram counts times per bin.
func histogram(times []time.Duration, bin time.Duration, bins int) []int {
	h := make([]int, bins)
	for _, t := range times {
		if i := int(t / bin); i >= 0 && i < bins {
			h[i]++
		}
	}
	return h
}

// bars returns the path drawing one bar per non-empty bin, in the panel's
// coordinates (y grows downwards from the plot's top): one path per series
// keeps the file small.
func bars(h []int, bin time.Duration, xOf func(time.Duration) float64, yOf func(int) float64) string {
	var b strings.Builder
	for i, n := range h {
		if n == 0 {
			continue
		}
		x0, x1 := xOf(time.Duration(i)*bin), xOf(time.Duration(i+1)*bin)
		fmt.Fprintf(&b, "M%s %sH%sV%sH%sZ", px(x0), px(plotH), px(x1), px(yOf(n)), px(x0))
	}
	return b.String()
}

// rolling returns the path of the step function "how many of times fall in
// (t − period, t]" for t from 0 to span: it rises at each time and falls a
// period later, so it is drawn exactly, not sampled, to the tenth of a
// pixel its coordinates keep. The changes within one tenth of a pixel are
// drawn as one vertical stroke over the values they reach, so the path
// stays small however many requests there are, and its peak is kept.
func rolling(times []time.Duration, period, span time.Duration, xOf func(time.Duration) float64, yOf func(int) float64) string {
	type event struct {
		at time.Duration
		d  int
	}
	events := make([]event, 0, 2*len(times))
	for _, t := range times {
		events = append(events, event{t, +1}, event{t + period, -1})
	}
	slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	var b strings.Builder
	fmt.Fprintf(&b, "M%s %s", px(xOf(0)), px(yOf(0)))
	n := 0
	for i := 0; i < len(events) && events[i].at <= span; {
		x := px(xOf(events[i].at))
		from, lo, hi := n, math.MaxInt, math.MinInt
		for ; i < len(events) && events[i].at <= span && px(xOf(events[i].at)) == x; i++ {
			n += events[i].d
			if i+1 == len(events) || events[i+1].at != events[i].at {
				lo, hi = min(lo, n), max(hi, n) // the value held from this time on
			}
		}
		fmt.Fprintf(&b, "H%s", x)
		if hi > max(from, n) {
			fmt.Fprintf(&b, "V%s", px(yOf(hi)))
		}
		if lo < min(from, n) {
			fmt.Fprintf(&b, "V%s", px(yOf(lo)))
		}
		fmt.Fprintf(&b, "V%s", px(yOf(n)))
	}
	fmt.Fprintf(&b, "H%s", px(xOf(span)))
	return b.String()
}

// ticks returns the times to label on the time axis: a round step giving
// at most about ten labels.
func ticks(span time.Duration) []time.Duration {
	step := (span + 10*24*time.Hour - 1) / (10 * 24 * time.Hour) * (24 * time.Hour) // whole days, past the steps
	for _, s := range roundSteps() {
		if s >= time.Millisecond && span/s <= 10 {
			step = s
			break
		}
	}
	var ts []time.Duration
	for t := time.Duration(0); t <= span; t += step {
		ts = append(ts, t)
	}
	return ts
}

// tickText labels the tick at t, one of ts: in days when they step by
// whole days (50d, not 1200h), else as short does.
func tickText(t time.Duration, ts []time.Duration) string {
	const day = 24 * time.Hour
	if len(ts) > 1 && (ts[1]-ts[0])%day == 0 {
		return strconv.FormatInt(int64(t/day), 10) + "d"
	}
	return short(t)
}

// niceCeil rounds v up to a round number: 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
// times a power of ten.
func niceCeil(v float64) int {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return int(m * p)
		}
	}
	return int(10 * p)
}

// px formats a coordinate to a tenth of a pixel.
func px(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }

// esc escapes text for XML.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

var chartTemplate = template.Must(template.New("chart").Funcs(template.FuncMap{"esc": esc}).Parse(`<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" font-family="system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{{.Left}}" y="22" font-size="15" font-weight="bold" fill="#222">{{esc .Title}}</text>
<text x="{{.Left}}" y="40" fill="#555">{{esc .Subtitle}}</text>
<g transform="translate({{.Left}},50)" fill="#555">
<rect width="12" height="10" fill="#d0d0d0"/><text x="17" y="9">offered per {{esc .BinText}}</text>
<rect x="150" width="12" height="10" fill="#888" fill-opacity="0.55"/><text x="167" y="9">admitted per {{esc .BinText}}</text>
<line x1="300" y1="5" x2="324" y2="5" stroke="#444" stroke-width="1.5"/><text x="330" y="9">admitted in the last {{esc .LastText}}</text>
<line x1="500" y1="5" x2="524" y2="5" stroke="#222" stroke-dasharray="4 3"/><text x="530" y="9">the limit: {{esc .Limit}}</text>
</g>
{{range .Panels}}<g>
<text x="{{$.Left}}" y="{{.Y}}" dy="13"><tspan font-weight="bold" fill="{{.Color}}">{{esc .Name}}</tspan><tspan fill="#444" font-size="11">  {{esc .Stats}}</tspan></text>
<g transform="translate(0,{{.PlotY}})">
<rect x="{{$.Left}}" width="{{$.PlotW}}" height="{{$.PlotH}}" fill="#fafafa" stroke="#d8d8d8"/>
{{range $.Ticks}}<line x1="{{.X}}" x2="{{.X}}" y2="{{$.PlotH}}" stroke="#ececec"/>
{{end}}<path d="{{.Offered}}" fill="#d0d0d0"/>
<path d="{{.Admitted}}" fill="{{.Color}}" fill-opacity="0.55"/>
<line x1="{{$.Left}}" x2="{{$.Right}}" y1="{{.LimitY}}" y2="{{.LimitY}}" stroke="#222" stroke-dasharray="4 3"/>
<path d="{{.Window}}" fill="none" stroke="{{.Color}}" stroke-width="1.5" stroke-linejoin="round"/>
<text x="{{$.Left}}" dx="-4" y="9" text-anchor="end" fill="#777">{{$.Top}}</text>
<text x="{{$.Left}}" dx="-4" y="{{.LimitY}}" dy="4" text-anchor="end" fill="#222">{{$.Rate}}</text>
<text x="{{$.Left}}" dx="-4" y="{{$.PlotH}}" text-anchor="end" fill="#777">0</text>
</g>
</g>
{{end}}<g fill="#555" text-anchor="middle">
{{range .Ticks}}<text x="{{.X}}" y="{{$.AxisY}}">{{esc .Label}}</text>
{{end}}</g>
</svg>
`))
