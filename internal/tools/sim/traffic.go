package sim

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Traffic is one client's requests: when each arrives, relative to the
// start, in order. Every request costs 1.
type Traffic struct {
	// Name is short, for file names: "steady", "bursty", or a CSV's name.
	Name string
	// Description says what the traffic is, for a chart's title.
	Description string
	// Times are the arrivals, sorted, each a whole number of µs.
	Times []time.Duration
	// Span is how long the traffic lasts: at least the last arrival.
	Span time.Duration
}

// MaxRequests bounds a pattern's requests, and so the memory and the time
// a simulation takes.
const MaxRequests = 5_000_000

// Patterns lists the standard patterns' names, in the order Standard
// returns them.
var Patterns = []string{"steady", "bursty", "boundary", "ramp"}

// Pattern returns the standard pattern called name for a limit of l.Rate
// per l.Period, lasting span; seed drives the random arrivals of "bursty"
// (the others are regular). The patterns are defined relative to the limit,
// so they test any limit the same way:
//
//   - steady: 1.5× the rate, evenly spaced — sustained overload.
//   - bursty: a background of random (Poisson) arrivals at half the rate,
//     and every 5 periods a burst of 3× the rate within a fifth of a period —
//     a page that fires many requests at once.
//   - boundary: the rate's worth of requests in the last tenth of a period
//     before a window edge and as many in the first tenth after it, at every
//     other edge — an attack on fixed windows.
//   - ramp: a rate rising steadily from 0 to 3× the limit.
//
// A pattern holds at most MaxRequests requests: Pattern refuses a limit and
// span for which 1.5 × rate × span ÷ period, the most any of them makes,
// is more.
func Pattern(name string, l tollgate.Limit, span time.Duration, seed uint64) (Traffic, error) {
	if l.Rate < 1 || l.Period <= 0 || span <= 0 {
		return Traffic{}, fmt.Errorf("sim: pattern %s needs a rate, a period and a span, got %d per %v over %v", name, l.Rate, l.Period, span)
	}
	if n := 1.5 * float64(l.Rate) * span.Seconds() / l.Period.Seconds(); n > MaxRequests {
		return Traffic{}, fmt.Errorf("sim: pattern %s: %d per %v over %v makes up to %.0f requests; a pattern holds at most %d requests",
			name, l.Rate, short(l.Period), short(span), n, MaxRequests)
	}
	r, p := float64(l.Rate), l.Period.Seconds()
	tr := Traffic{Name: name, Span: span}
	switch name {
	case "steady":
		gap := p / (1.5 * r)
		for k := 0; float64(k)*gap < span.Seconds(); k++ { // k·gap: no error adds up
			tr.Times = append(tr.Times, seconds(float64(k)*gap))
		}
		tr.Description = fmt.Sprintf("%s per %s, evenly spaced (1.5× the limit)", num(1.5*r), short(l.Period))
	case "bursty":
		rng := rand.New(rand.NewPCG(seed, 0x7011))
		for t := rng.ExpFloat64() * p / (0.5 * r); t < span.Seconds(); t += rng.ExpFloat64() * p / (0.5 * r) {
			tr.Times = append(tr.Times, seconds(t))
		}
		n := 3 * l.Rate
		for k := 0; p+5*p*float64(k) < span.Seconds(); k++ {
			start := p + 5*p*float64(k)
			for i := range n {
				tr.Times = append(tr.Times, seconds(start+0.2*p*float64(i)/float64(n)))
			}
		}
		tr.Description = fmt.Sprintf("random arrivals at %s per %s, and every %s a burst of %d within %s",
			num(0.5*r), short(l.Period), short(5*l.Period), n, short(l.Period/5))
	case "boundary":
		for k := 0; p+2*p*float64(k) < span.Seconds(); k++ {
			edge := p + 2*p*float64(k)
			for i := range 2 * l.Rate {
				tr.Times = append(tr.Times, seconds(edge-0.1*p+0.2*p*float64(i)/float64(2*l.Rate)))
			}
		}
		tr.Description = fmt.Sprintf("%d in the last %s before every other window edge, %d in the first %s after it",
			l.Rate, short(l.Period/10), l.Rate, short(l.Period/10))
	case "ramp":
		// The rate rises as 3r/p · t/span, so the k-th request arrives when
		// the integral reaches k: t = sqrt(2·k·p·span / (3r)).
		for k := 0; ; k++ {
			t := math.Sqrt(2 * float64(k) * p * span.Seconds() / (3 * r))
			if t >= span.Seconds() {
				break
			}
			tr.Times = append(tr.Times, seconds(t))
		}
		tr.Description = fmt.Sprintf("a rate rising steadily from 0 to %s per %s (3× the limit)", num(3*r), short(l.Period))
	default:
		return Traffic{}, fmt.Errorf("sim: unknown pattern %q (want one of %s)", name, strings.Join(Patterns, ", "))
	}
	slices.Sort(tr.Times)
	return tr, nil
}

// Standard returns every pattern in Patterns.
func Standard(l tollgate.Limit, span time.Duration, seed uint64) ([]Traffic, error) {
	var all []Traffic
	for _, name := range Patterns {
		tr, err := Pattern(name, l, span, seed)
		if err != nil {
			return nil, err
		}
		all = append(all, tr)
	}
	return all, nil
}

// seconds converts a time in seconds to a Duration of whole µs.
func seconds(s float64) time.Duration {
	return time.Duration(math.Round(s*1e6)) * time.Microsecond
}

// num prints a rate without needless decimals: 15, 7.5.
func num(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

// short prints a duration without zero tails: 1s, 5s, 100ms, 1m.
func short(d time.Duration) string {
	s := d.String()
	for _, tail := range []string{"m0s", "h0m"} {
		if strings.HasSuffix(s, tail) {
			s = strings.TrimSuffix(s, tail[1:])
		}
	}
	return s
}

// maxCSVSpan is the longest traffic ReadCSV reads: 100 years (of 365.25
// days), well within what a time.Duration holds.
const maxCSVSpan = 36525 * 24 * time.Hour

// ReadCSV reads a client's traffic: one request per line, whose first field
// is its time, as seconds (a decimal number: a Unix time such as
// 1764478535.123456, or an offset such as 0.25) or as RFC 3339 text
// (2026-01-02T15:04:05.123Z). Other fields are ignored; so are blank lines,
// lines starting with '#', and a header line before the first time. Times
// are kept to the µs, sorted, and made relative to the earliest; the
// latest may come at most maxCSVSpan after it.
func ReadCSV(r io.Reader, name string) (Traffic, error) {
	cr := csv.NewReader(bufio.NewReader(r))
	cr.FieldsPerRecord = -1
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	var abs []int64 // µs
	for records := 1; ; records++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			return Traffic{}, fmt.Errorf("sim: %s: %w", name, err)
		}
		us, err := parseTime(strings.TrimSpace(rec[0]))
		if err != nil {
			if records == 1 {
				continue // a header
			}
			return Traffic{}, fmt.Errorf("sim: %s line %d: %w", name, line, err)
		}
		abs = append(abs, us)
	}
	if len(abs) == 0 {
		return Traffic{}, fmt.Errorf("sim: %s holds no request times", name)
	}
	slices.Sort(abs)
	if abs[len(abs)-1]-abs[0] > maxCSVSpan.Microseconds() {
		return Traffic{}, fmt.Errorf("sim: %s spans more than 100 years", name)
	}
	tr := Traffic{Name: name, Times: make([]time.Duration, len(abs))}
	for i, us := range abs {
		tr.Times[i] = time.Duration(us-abs[0]) * time.Microsecond
	}
	tr.Span = tr.Times[len(tr.Times)-1] + time.Microsecond
	tr.Description = fmt.Sprintf("%d requests from %s over %v", len(abs), name, tr.Span.Round(time.Millisecond))
	return tr, nil
}

// parseTime reads a time in µs: decimal seconds, read digit by digit so a
// Unix time keeps its µs (a float64 would not), or RFC 3339.
func parseTime(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("empty time")
	}
	if s[0] >= '0' && s[0] <= '9' && !strings.ContainsAny(s, "-:T") {
		whole, frac, _ := strings.Cut(s, ".")
		sec, err := strconv.ParseInt(whole, 10, 64)
		if err != nil || sec < 0 || sec > math.MaxInt64/1_000_000-1 {
			return 0, fmt.Errorf("bad time %q: want seconds or RFC 3339", s)
		}
		if len(frac) > 6 {
			frac = frac[:6] // below a µs: the stores count in µs
		}
		us := int64(0)
		if frac != "" {
			if us, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil {
				return 0, fmt.Errorf("bad time %q: want seconds or RFC 3339", s)
			}
		}
		return sec*1e6 + us, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, fmt.Errorf("bad time %q: want seconds or RFC 3339", s)
	}
	return t.UnixMicro(), nil
}
