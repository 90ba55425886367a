package sim

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Write prints tu for people: the log, its bad lines, the clients'
// rates, the recommendation (for a rules file and for Go), the bursts
// tried, and a Markdown table of the impact per algorithm.
func (tu *Tuning) Write(w io.Writer) error {
	var b strings.Builder
	span := tu.End.Sub(tu.Start)
	fmt.Fprintf(&b, "Log (%s): %d lines from %s to %s (%s): %d requests of %d clients; %s.\n",
		tu.Format, tu.Lines, tu.Start.Format(time.RFC3339), tu.End.Format(time.RFC3339), short(span.Round(time.Second)),
		tu.Requests, len(tu.Clients), countOf(tu.Bad, "bad line"))
	for _, bl := range tu.BadFirst {
		fmt.Fprintf(&b, "  line %d: %s\n", bl.Line, bl.Reason)
	}
	if tu.Bad > int64(len(tu.BadFirst)) {
		fmt.Fprintf(&b, "  (the first %d of %d bad lines)\n", len(tu.BadFirst), tu.Bad)
	}
	if tu.WholeSeconds {
		b.WriteString("Times are whole seconds: the replays spread each second's requests of a client evenly over it.\n")
	}
	if tu.Late > 0 {
		fmt.Fprintf(&b, "%s came up to %s before an earlier line's time, and are counted at that time.\n", countOf(tu.Late, "request"), short(MaxLate))
	}
	if tu.Beyond > 0 {
		fmt.Fprintf(&b, "More than %d clients: the %d requests of the clients first seen after the first %d are not analysed (raise the bound on clients).\n",
			tu.MaxClients, tu.Beyond, tu.MaxClients)
	}
	b.WriteString("\nRequests per second of each client, over the seconds it sent any, across the clients:\n\n")
	b.WriteString("| each client's | p50 | p95 | p99 | max |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, r := range []struct {
		name string
		s    Spread
	}{{"p95", tu.P95}, {"p99", tu.P99}} {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d |\n", r.name, r.s.P50, r.s.P95, r.s.P99, r.s.Max)
	}
	l, p := tu.Limit, tu.P99.P99
	fmt.Fprintf(&b, "\nRecommended, for each client: a token bucket of %d/s (%d, the p99 of the clients' p99s, + 10%%), burst %d (%d s of %d): %s.\n",
		l.Rate, p, l.Burst, tu.BurstSeconds, p, tu.metText())
	fmt.Fprintf(&b, "  rules file: rate_limit: {unit: second, requests_per_unit: %d, algorithm: token_bucket, burst: %d}\n", l.Rate, l.Burst)
	fmt.Fprintf(&b, "  Go:         tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: %d, Period: time.Second, Burst: %d}\n", l.Rate, l.Burst)
	b.WriteString("Bursts tried:")
	for i, t := range tu.Bursts {
		sep := ";"
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&b, "%s %d s (%d): %d limited", sep, t.Seconds, t.Burst, t.ClientsLimited)
	}
	fmt.Fprintf(&b, ".\n\nWhat %d per second would have done to this log's clients:\n\n", l.Rate)
	b.WriteString("| algorithm | clients limited | requests limited |\n| --- | ---: | ---: |\n")
	for _, im := range tu.Impact {
		if im.Skipped != "" {
			fmt.Fprintf(&b, "| %s | not run: %s | |\n", impactName(im.Limit), im.Skipped)
			continue
		}
		fmt.Fprintf(&b, "| %s | %d (%s) | %d (%s) |\n", impactName(im.Limit),
			im.ClientsLimited, percent(int64(im.ClientsLimited), int64(len(tu.Clients))),
			im.RequestsLimited, percent(im.RequestsLimited, tu.Requests))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// metText says what the recommended burst leaves never limited.
func (tu *Tuning) metText() string {
	limited := tu.Bursts[tu.BurstSeconds-minBurstS].ClientsLimited
	share := percent(int64(len(tu.Clients)-limited), int64(len(tu.Clients)))
	if tu.Met {
		return share + " of the clients never limited"
	}
	return fmt.Sprintf("only %s of the clients never limited, less than %d%% even with %d s of burst: their peaks last longer than a bucket should absorb, so raise the rate, not the burst",
		share, clientsTarget, maxBurstS)
}

func impactName(l tollgate.Limit) string {
	switch l.Algorithm {
	case tollgate.TokenBucket, tollgate.GCRA:
		return fmt.Sprintf("%s (burst %d)", l.Algorithm, l.Burst)
	case tollgate.LeakyBucket:
		return fmt.Sprintf("%s (burst %d, policing)", l.Algorithm, l.Burst)
	}
	return l.Algorithm.String()
}

// countOf prints n things: "1 bad line", "2 bad lines".
func countOf(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.FormatInt(n, 10) + " " + what + "s"
}

// percent prints n of total as a percentage, with two decimals, or more
// for a share too small to show so.
func percent(n, total int64) string {
	if total == 0 {
		return "0%"
	}
	v := 100 * float64(n) / float64(total)
	prec := 2
	for v > 0 && v < math.Pow10(-prec) && prec < 6 {
		prec++
	}
	return strconv.FormatFloat(v, 'f', prec, 64) + "%"
}

// The geometry of a tuning's chart, in SVG user units.
const (
	tuneW      = 960
	tuneLeft   = 56
	tuneRight  = 16
	tuneTop    = 94 // title, subtitles, legend
	tunePlotH  = 320
	tuneBottom = 44 // the x axis's labels and name
	tunePlotW  = tuneW - tuneLeft - tuneRight
)

// WriteTuneSVG draws tu's clients as an SVG chart: each client's p99 and
// p95 requests per second, the clients ranked by their p99 from left
// (0%) to right (100%), on a logarithmic scale, with the recommended rate
// (dashed) and, in red, the clients the recommended token bucket would
// have limited. With more clients than pixels, each pixel shows the
// highest of its clients. name titles the chart.
func WriteTuneSVG(w io.Writer, tu *Tuning, name string) error {
	n := len(tu.Clients)
	if n == 0 {
		return fmt.Errorf("sim: chart: no clients")
	}
	top := float64(niceCeil(1.2 * float64(max(tu.P99.Max, tu.Limit.Rate, 1))))
	yOf := func(v int) float64 { return tunePlotH * (1 - math.Log10(float64(max(v, 1)))/math.Log10(top)) }
	cols := columns(tu.Clients)
	colW := float64(tunePlotW) / float64(len(cols))
	var p99, p95, red strings.Builder
	for i, c := range cols {
		x0, x1 := tuneLeft+colW*float64(i), tuneLeft+colW*float64(i+1)
		step := func(b *strings.Builder, v int) {
			if b.Len() == 0 {
				fmt.Fprintf(b, "M%s %s", px(x0), px(yOf(v)))
			} else {
				fmt.Fprintf(b, "V%s", px(yOf(v)))
			}
			fmt.Fprintf(b, "H%s", px(x1))
		}
		step(&p99, c.P99)
		step(&p95, c.P95)
		if c.Limited {
			fmt.Fprintf(&red, "M%s %sH%s", px(x0), px(yOf(c.P99)), px(max(x1, x0+1)))
		}
	}
	limited := tu.tokenBucket().ClientsLimited
	sub := tuneSubtitle(tu)
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif" font-size="12">
<rect width="100%%" height="100%%" fill="#ffffff"/>
<text x="%d" y="22" font-size="15" font-weight="bold" fill="#222">%s</text>
<text x="%d" y="40" fill="#555">%s</text>
<text x="%d" y="56" fill="#555">%s</text>
<g transform="translate(%d,70)" fill="#555">
<line x1="0" y1="5" x2="24" y2="5" stroke="#1f77b4" stroke-width="1.5"/><text x="30" y="9">each client's p99</text>
<line x1="150" y1="5" x2="174" y2="5" stroke="#999" stroke-width="1.5"/><text x="180" y="9">each client's p95</text>
<line x1="300" y1="5" x2="324" y2="5" stroke="#d62728" stroke-width="3"/><text x="330" y="9">limited by the recommended token bucket (%d)</text>
<line x1="620" y1="5" x2="644" y2="5" stroke="#222" stroke-dasharray="4 3"/><text x="650" y="9">the recommended rate: %d/s</text>
</g>
<g transform="translate(0,%d)">
<rect x="%d" width="%d" height="%d" fill="#fafafa" stroke="#d8d8d8"/>
`, tuneW, tuneTop+tunePlotH+tuneBottom, tuneW, tuneTop+tunePlotH+tuneBottom,
		tuneLeft, esc(name), tuneLeft, esc(sub[0]), tuneLeft, esc(sub[1]), tuneLeft, limited, tu.Limit.Rate,
		tuneTop, tuneLeft, tunePlotW, tunePlotH)
	for v := 1; float64(v) <= top; v *= 10 {
		y := px(yOf(v))
		fmt.Fprintf(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%s\" y2=\"%s\" stroke=\"#ececec\"/><text x=\"%d\" dx=\"-4\" y=\"%s\" dy=\"4\" text-anchor=\"end\" fill=\"#777\">%d</text>\n",
			tuneLeft, tuneLeft+tunePlotW, y, y, tuneLeft, y, v)
	}
	fmt.Fprintf(&b, "<text x=\"%d\" dx=\"-4\" y=\"9\" text-anchor=\"end\" fill=\"#777\">%d</text>\n", tuneLeft, int(top))
	rateY := px(yOf(tu.Limit.Rate))
	fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="#999" stroke-width="1.5"/>
<path d="%s" fill="none" stroke="#1f77b4" stroke-width="1.5"/>
<path d="%s" fill="none" stroke="#d62728" stroke-width="3"/>
<line x1="%d" x2="%d" y1="%s" y2="%s" stroke="#222" stroke-dasharray="4 3"/>
<text x="%d" dx="4" y="%s" dy="-4" fill="#222">%d/s</text>
`, p95.String(), p99.String(), red.String(), tuneLeft, tuneLeft+tunePlotW, rateY, rateY, tuneLeft, rateY, tu.Limit.Rate)
	for _, pct := range []int{0, 25, 50, 75, 100} {
		x := px(tuneLeft + float64(tunePlotW)*float64(pct)/100)
		fmt.Fprintf(&b, "<line x1=\"%s\" x2=\"%s\" y1=\"%d\" y2=\"%d\" stroke=\"#bbb\"/><text x=\"%s\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">%d%%</text>\n",
			x, x, tunePlotH, tunePlotH+4, x, tunePlotH+17, pct)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" fill="#555">the clients, ranked by their p99 (requests per second, logarithmic)</text>
</g>
</svg>
`, tuneLeft+tunePlotW/2, tunePlotH+35)
	_, err := io.WriteString(w, b.String())
	return err
}

// tuneSubtitle says what a tuning's chart shows, in two lines.
func tuneSubtitle(tu *Tuning) [2]string {
	l, im := tu.Limit, tu.tokenBucket()
	return [2]string{
		fmt.Sprintf("%d clients, %d requests over %s.", len(tu.Clients), tu.Requests, short(tu.End.Sub(tu.Start).Round(time.Second))),
		fmt.Sprintf("Recommended: a token bucket of %d/s, burst %d (%d s of %d, the p99 of their p99s): %d clients limited, %s of the requests.",
			l.Rate, l.Burst, tu.BurstSeconds, tu.P99.P99, im.ClientsLimited, percent(im.RequestsLimited, tu.Requests)),
	}
}

// tokenBucket returns the token bucket's impact.
func (tu *Tuning) tokenBucket() Impact {
	for _, im := range tu.Impact {
		if im.Limit.Algorithm == tollgate.TokenBucket {
			return im
		}
	}
	return Impact{}
}

// columns returns the clients as the chart's columns: one per client, or
// with more clients than pixels one per pixel, showing the highest p99
// and p95 of its clients and whether any was limited.
func columns(clients []ClientRate) []ClientRate {
	if len(clients) <= tunePlotW {
		return clients
	}
	cols := make([]ClientRate, tunePlotW)
	for i, c := range clients {
		col := &cols[i*tunePlotW/len(clients)]
		col.P99, col.P95 = max(col.P99, c.P99), max(col.P95, c.P95)
		col.Limited = col.Limited || c.Limited
	}
	return cols
}
