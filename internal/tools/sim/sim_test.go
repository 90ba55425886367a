package sim

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/redistest"
)

var server *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &server) }

const ms = time.Millisecond

var limit10 = tollgate.Limit{Rate: 10, Period: time.Second, Burst: 10}

func TestMaxInPeriod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		times []time.Duration
		want  int
	}{
		{"none", nil, 0},
		{"one", []time.Duration{5 * ms}, 1},
		{"same instant", []time.Duration{0, 0, 0}, 3},
		// (t − 1s, t]: a request exactly a period after another is in a
		// span of its own, as the sliding log counts.
		{"exactly a period apart", []time.Duration{0, 1000 * ms}, 1},
		{"just inside a period", []time.Duration{0, 999 * ms}, 2},
		{"two clusters", []time.Duration{0, 100 * ms, 200 * ms, 1500 * ms, 1600 * ms, 2100 * ms, 2200 * ms}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := maxInPeriod(tc.times, time.Second); got != tc.want {
				t.Errorf("maxInPeriod(%v) = %d, want %d", tc.times, got, tc.want)
			}
		})
	}
}

func TestAgainstLog(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		leaves, denied    []time.Duration
		rate              int
		wantOver, wantUnd int
	}{
		{"within the rate", []time.Duration{0, 100 * ms}, nil, 2, 0, 0},
		{"third in a period", []time.Duration{0, 100 * ms, 200 * ms}, nil, 2, 1, 0},
		{"a period later is fine", []time.Duration{0, 100 * ms, 1000 * ms}, nil, 2, 0, 0},
		{"denied while full", []time.Duration{0, 100 * ms}, []time.Duration{500 * ms}, 2, 0, 0},
		{"denied with room", []time.Duration{0}, []time.Duration{500 * ms}, 2, 0, 1},
		{"denied after the window emptied", []time.Duration{0, 100 * ms}, []time.Duration{1100 * ms}, 2, 0, 1},
		{"denied exactly a period after the first", []time.Duration{0, 100 * ms}, []time.Duration{1000 * ms}, 2, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			over, under := againstLog(tc.leaves, tc.denied, tc.rate, time.Second)
			if over != tc.wantOver || under != tc.wantUnd {
				t.Errorf("againstLog = over %d, under %d; want %d, %d", over, under, tc.wantOver, tc.wantUnd)
			}
		})
	}
}

func TestPatterns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		want int // requests in 20 s at 10 per second
	}{
		{"steady", 300},   // 15/s × 20 s
		{"boundary", 200}, // 10 attacks (every other edge of 20) × 20
		{"ramp", 300},     // the integral of 0 → 30/s over 20 s
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := Pattern(tc.name, limit10, 20*time.Second, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(tr.Times); got != tc.want {
				t.Errorf("%d requests, want %d", got, tc.want)
			}
			checkTimes(t, tr)
		})
	}
	t.Run("bursty", func(t *testing.T) {
		a, err := Pattern("bursty", limit10, 20*time.Second, 7)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Pattern("bursty", limit10, 20*time.Second, 7)
		c, _ := Pattern("bursty", limit10, 20*time.Second, 8)
		if !slices.Equal(a.Times, b.Times) {
			t.Error("the same seed gave different traffic")
		}
		if slices.Equal(a.Times, c.Times) {
			t.Error("different seeds gave the same traffic")
		}
		// 4 bursts of 30 (at 1, 6, 11, 16 s) on top of about 100 random.
		if n := len(a.Times); n < 120+50 || n > 120+150 {
			t.Errorf("%d requests, want 120 in bursts plus about 100", n)
		}
		checkTimes(t, a)
	})
	t.Run("unknown", func(t *testing.T) {
		if _, err := Pattern("spiky", limit10, time.Second, 1); err == nil || !strings.Contains(err.Error(), "steady, bursty, boundary, ramp") {
			t.Errorf("error %v, want one listing the patterns", err)
		}
	})
}

func checkTimes(t *testing.T, tr Traffic) {
	t.Helper()
	if !slices.IsSorted(tr.Times) {
		t.Error("times are not sorted")
	}
	for _, at := range tr.Times {
		if at < 0 || at >= tr.Span || at%time.Microsecond != 0 {
			t.Fatalf("time %v outside [0, %v) or not whole µs", at, tr.Span)
		}
	}
}

// results runs a pattern and returns its results by algorithm.
func results(t *testing.T, pattern string, cfg Config) map[tollgate.Algorithm]Result {
	t.Helper()
	tr, err := Pattern(pattern, cfg.Limit, 20*cfg.Limit.Period, 1)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), tr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := map[tollgate.Algorithm]Result{}
	for _, r := range rep.Results {
		if r.Admitted+r.Denied != len(tr.Times) || len(r.Leaves) != r.Admitted {
			t.Errorf("%s: %d admitted + %d denied of %d requests, %d leaves", r.Limit.Algorithm, r.Admitted, r.Denied, len(tr.Times), len(r.Leaves))
		}
		m[r.Limit.Algorithm] = r
	}
	return m
}

func TestRunBoundaryAttack(t *testing.T) {
	t.Parallel()
	shaped := Config{Limit: limit10, MaxDelay: time.Second, LeakyBurst: 1}
	tests := []struct {
		alg             tollgate.Algorithm
		admitted, maxIn int
		over, under     int
	}{
		// Each attack: 10 before the edge, 10 after, within 200 ms.
		{alg: tollgate.FixedWindow, admitted: 200, maxIn: 20, over: 100},          // 2× the limit at every edge
		{alg: tollgate.SlidingWindowLog, admitted: 100, maxIn: 10},                // exactly the limit
		{alg: tollgate.SlidingWindowCounter, admitted: 100, maxIn: 10},            // the previous window still weighs
		{alg: tollgate.TokenBucket, admitted: 110, maxIn: 11, over: 10},           // burst 10 + 1 refilled in 100 ms
		{alg: tollgate.GCRA, admitted: 110, maxIn: 11, over: 10},                  // the same as the bucket
		{alg: tollgate.LeakyBucket, admitted: 120, maxIn: 10, over: 0, under: -1}, // queues 10 more per 1 s...
	}
	got := results(t, "boundary", shaped)
	for _, tc := range tests {
		r := got[tc.alg]
		if r.Admitted != tc.admitted || r.MaxInPeriod != tc.maxIn || r.Over != tc.over || r.Under != tc.under {
			t.Errorf("%s: admitted %d, most in 1s %d, over %d, under %d; want %d, %d, %d, %d",
				tc.alg, r.Admitted, r.MaxInPeriod, r.Over, r.Under, tc.admitted, tc.maxIn, tc.over, tc.under)
		}
		if r.LogAdmitted != 100 {
			t.Errorf("%s: LogAdmitted %d, want the log's 100", tc.alg, r.LogAdmitted)
		}
	}
	if d := got[tollgate.LeakyBucket].MaxDelay; d <= 0 || d > time.Second {
		t.Errorf("the shaper's longest delay is %v, want between 0 and its max delay 1s", d)
	}
}

func TestRunInvariants(t *testing.T) {
	t.Parallel()
	for _, name := range Patterns {
		for _, cfg := range []Config{
			{Limit: limit10, MaxDelay: time.Second, LeakyBurst: 1},
			{Limit: tollgate.Limit{Rate: 7, Period: 3 * time.Second, Burst: 4}},
		} {
			t.Run(fmt.Sprintf("%s/%v", name, cfg.Limit), func(t *testing.T) {
				t.Parallel()
				got := results(t, name, cfg)
				log := got[tollgate.SlidingWindowLog]
				// The log is exact: never more than the rate in a period,
				// and never a decision it would itself make otherwise.
				if log.MaxInPeriod > cfg.Limit.Rate || log.Over != 0 || log.Under != 0 {
					t.Errorf("sliding log: most in a period %d, over %d, under %d; want ≤ %d, 0, 0", log.MaxInPeriod, log.Over, log.Under, cfg.Limit.Rate)
				}
				// The sliding window counter never lets through more than
				// the rate in a window's worth of its estimate... but it is
				// an estimate: it may exceed by little, never by 2×.
				if swc := got[tollgate.SlidingWindowCounter]; swc.MaxInPeriod >= 2*cfg.Limit.Rate {
					t.Errorf("sliding window counter: most in a period %d", swc.MaxInPeriod)
				}
				// A token bucket admits at most burst + rate in a period.
				if tb := got[tollgate.TokenBucket]; tb.MaxInPeriod > cfg.Limit.Burst+cfg.Limit.Rate {
					t.Errorf("token bucket: most in a period %d, want ≤ burst + rate", tb.MaxInPeriod)
				}
				// GCRA decides as the token bucket does when period/rate is
				// a whole number of µs (not for 7 per 3 s).
				if g, tb := got[tollgate.GCRA], got[tollgate.TokenBucket]; cfg.Limit.Period.Microseconds()%int64(cfg.Limit.Rate) == 0 &&
					(g.Admitted != tb.Admitted || !slices.Equal(g.Leaves, tb.Leaves)) {
					t.Errorf("gcra admitted %d, token bucket %d: want the same decisions", g.Admitted, tb.Admitted)
				}
				lb := got[tollgate.LeakyBucket]
				if cfg.MaxDelay == 0 {
					if tb := got[tollgate.TokenBucket]; !slices.Equal(lb.Leaves, tb.Leaves) {
						t.Error("a policing leaky bucket decided otherwise than the token bucket")
					}
				} else if lb.MaxInPeriod > cfg.Limit.Rate || lb.Over != 0 {
					// A shaper with a burst of 1 spaces what leaves at the rate.
					t.Errorf("shaping leaky bucket: most in a period %d, over %d; want ≤ %d, 0", lb.MaxInPeriod, lb.Over, cfg.Limit.Rate)
				}
				// The log's memory grows with what it holds; the others' not.
				for a, r := range got {
					if a != tollgate.SlidingWindowLog && r.MemoryBytes != got[tollgate.TokenBucket].MemoryBytes {
						t.Errorf("%s holds %d bytes, the token bucket %d: want the same constant", a, r.MemoryBytes, got[tollgate.TokenBucket].MemoryBytes)
					}
				}
				if log.MemoryBytes <= got[tollgate.TokenBucket].MemoryBytes {
					t.Errorf("sliding log holds %d bytes, no more than a token bucket's %d", log.MemoryBytes, got[tollgate.TokenBucket].MemoryBytes)
				}
			})
		}
	}
}

func TestRunSteadyOverload(t *testing.T) {
	t.Parallel()
	got := results(t, "steady", Config{Limit: limit10})
	// 15/s against 10/s for 20 s: the exact limits admit 10 per second.
	for _, a := range []tollgate.Algorithm{tollgate.FixedWindow, tollgate.SlidingWindowLog} {
		if r := got[a]; r.Admitted != 200 {
			t.Errorf("%s admitted %d, want 200", a, r.Admitted)
		}
	}
	// The bucket: its burst of 10 first, then 10 per second.
	if r := got[tollgate.TokenBucket]; r.Admitted < 205 || r.Admitted > 210 {
		t.Errorf("token bucket admitted %d, want 200 + about the burst's worth", r.Admitted)
	}
	// The sliding window counter is stricter under sustained overload: the
	// previous window's full count weighs on the start of each window.
	if r := got[tollgate.SlidingWindowCounter]; r.Admitted >= 200 || r.Under == 0 {
		t.Errorf("sliding window counter admitted %d with %d denied with room, want fewer than 200 and some", r.Admitted, r.Under)
	}
}

func TestRunRejects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name string
		tr   Traffic
		cfg  Config
	}{
		{"no requests", Traffic{Name: "x"}, Config{Limit: limit10}},
		{"unsorted", Traffic{Name: "x", Times: []time.Duration{2, 1}}, Config{Limit: limit10}},
		{"negative", Traffic{Name: "x", Times: []time.Duration{-1}}, Config{Limit: limit10}},
		{"invalid limit", Traffic{Name: "x", Times: []time.Duration{1}}, Config{Limit: tollgate.Limit{Rate: 0, Period: time.Second, Burst: 1}}},
	}
	for _, tc := range tests {
		if _, err := Run(ctx, tc.tr, tc.cfg); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// TestRunWithRedis replays the boundary attack through a real Redis: Run
// fails if any decision differs from memory's, and measures each key.
func TestRunWithRedis(t *testing.T) {
	t.Parallel()
	rdb := server.Client(t)
	cfg := Config{Limit: limit10, MaxDelay: time.Second, LeakyBurst: 1, Redis: rdb}
	got := results(t, "boundary", cfg)
	for a, r := range got {
		if r.RedisBytes <= 0 {
			t.Errorf("%s: RedisBytes %d, want MEMORY USAGE of the key", a, r.RedisBytes)
		}
	}
	if log, tb := got[tollgate.SlidingWindowLog].RedisBytes, got[tollgate.TokenBucket].RedisBytes; log <= tb {
		t.Errorf("in Redis the sliding log holds %d bytes, the token bucket %d: want the log larger", log, tb)
	}
	// Run deletes its keys when done.
	if n, err := rdb.Keys(context.Background(), "tollgate-sim:*").Result(); err != nil || len(n) != 0 {
		t.Errorf("keys left behind: %v, %v", n, err)
	}
}

func TestReadCSV(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		want     []time.Duration // relative, sorted
		wantErr  string
	}{
		{"offsets", "0\n0.5\n0.25\n", []time.Duration{0, 250 * ms, 500 * ms}, ""},
		{"unix times keep their µs", "1764478535.123456\n1764478535.123457\n1764478536\n",
			[]time.Duration{0, time.Microsecond, 876544 * time.Microsecond}, ""},
		{"header, comments, other fields", "time,path\n# a comment\n10.5,/a\n\n11,/b\n", []time.Duration{0, 500 * ms}, ""},
		{"RFC 3339", "2026-01-02T15:04:05Z\n2026-01-02T15:04:05.25+00:00\n", []time.Duration{0, 250 * ms}, ""},
		{"below a µs is dropped", "1.0000009\n1.000002\n", []time.Duration{0, 2 * time.Microsecond}, ""},
		{"bad line", "1\n2\nsoon\n", nil, "line 3"},
		{"negative", "-1\n", nil, "holds no request times"}, // the first line reads as a header
		{"negative later", "1\n-1\n", nil, "line 2"},
		{"empty", "", nil, "holds no request times"},
		{"only a header", "time\n", nil, "holds no request times"},
		{"99 years", "0\n3124137600\n", []time.Duration{0, 3124137600 * time.Second}, ""},
		{"over 100 years", "0\n3155760001\n", nil, "spans more than 100 years"},
		{"past what a duration holds", "1\n10000000000\n", nil, "spans more than 100 years"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ReadCSV(strings.NewReader(tc.in), "client")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tr.Times, tc.want) {
				t.Errorf("times %v, want %v", tr.Times, tc.want)
			}
			checkTimes(t, tr)
		})
	}
}

// TestRecommendLongSpan suggests a limit for four requests over a year,
// and over 99 years (more seconds than a 32-bit int counts): the
// percentiles count every idle second, yet memory follows the requests,
// not the seconds (a count per second of a year is 250 MB). Not parallel,
// so that the memory measured is its own.
func TestRecommendLongSpan(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for _, span := range []time.Duration{year, 99 * year} {
		tr := Traffic{Name: "long", Times: []time.Duration{0, span / 2, span / 2, span}, Span: span + time.Microsecond}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rec, err := Recommend(tr)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		if rec.P50 != 0 || rec.P99 != 0 || rec.Max != 2 || rec.Limit.Rate != 1 {
			t.Errorf("%v: p50 %d, p99 %d, max %d, rate %d; want 0, 0, 2, 1", span, rec.P50, rec.P99, rec.Max, rec.Limit.Rate)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
			t.Errorf("%v: Recommend allocated %d bytes for %d requests", span, got, len(tr.Times))
		}
	}
}

// TestRecommendPercentiles checks Recommend's requests per second against
// the counts of every second of random traffic, idle seconds included.
func TestRecommendPercentiles(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		seconds := 1 + rng.IntN(300)
		tr := Traffic{Span: time.Duration(seconds) * time.Second}
		for range 1 + rng.IntN(600) {
			tr.Times = append(tr.Times, time.Duration(rng.Int64N(int64(tr.Span))))
		}
		slices.Sort(tr.Times)
		all := histogram(tr.Times, time.Second, seconds)
		slices.Sort(all)
		q := func(p float64) int { return all[max(int(math.Ceil(p*float64(seconds)))-1, 0)] }
		rec, err := Recommend(tr)
		if err != nil {
			t.Fatal(err)
		}
		got := []int{rec.P50, rec.P95, rec.P99, rec.Max}
		if want := []int{q(0.5), q(0.95), q(0.99), all[seconds-1]}; !slices.Equal(got, want) {
			t.Fatalf("%d requests over %d s: p50, p95, p99, max %v, want %v", len(tr.Times), seconds, got, want)
		}
	}
}

func TestRecommend(t *testing.T) {
	t.Parallel()
	t.Run("met", func(t *testing.T) {
		// 10 minutes: 20 requests a second, and a burst of 100 in one
		// second every two minutes.
		var tr Traffic
		rng := rand.New(rand.NewPCG(1, 2))
		for s := range 600 {
			n := 20
			if s%120 == 30 {
				n = 100
			}
			for range n {
				tr.Times = append(tr.Times, time.Duration(s)*time.Second+time.Duration(rng.IntN(1e6))*time.Microsecond)
			}
		}
		slices.Sort(tr.Times)
		tr.Span = 600 * time.Second
		rec, err := Recommend(tr)
		if err != nil {
			t.Fatal(err)
		}
		// 5 of 600 seconds hold 100, fewer than 1%: p99 (the 594th of 600
		// counts) is 20, and p99 + 10% is 22 per second.
		if rec.P99 != 20 || rec.Max != 100 || rec.Limit.Rate != 22 {
			t.Errorf("p99 %d, max %d, rate %d; want 20, 100, 22", rec.P99, rec.Max, rec.Limit.Rate)
		}
		// The burst of 100 needs 100 − 22 = 78 tokens beyond the refill:
		// 4 s of p99 would be 80, but the rule starts at 5 s: 100.
		if !rec.Met || rec.BurstSeconds != 5 || rec.Limit.Burst != 100 || rec.Admitted < 0.99 {
			t.Errorf("%+v, want 5 s of p99 (100) admitting ≥ 99%%", rec)
		}
		var out bytes.Buffer
		if err := rec.Write(&out); err != nil || !strings.Contains(out.String(), "Rate: 22, Period: time.Second, Burst: 100}") {
			t.Errorf("Write: %v\n%s", err, out.String())
		}
	})
	t.Run("peaks too long", func(t *testing.T) {
		// 1000 seconds at 1 per second, but 5 seconds at 1000 per second:
		// p99 is 1, and most requests come in the peaks.
		var tr Traffic
		for s := range 1000 {
			n := 1
			if s >= 500 && s < 505 {
				n = 1000
			}
			for i := range n {
				tr.Times = append(tr.Times, time.Duration(s)*time.Second+time.Duration(i)*time.Millisecond)
			}
		}
		tr.Span = 1000 * time.Second
		rec, err := Recommend(tr)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Met || rec.BurstSeconds != 10 || rec.Admitted >= 0.99 {
			t.Errorf("%+v, want not met at 10 s", rec)
		}
		var out bytes.Buffer
		_ = rec.Write(&out)
		if !strings.Contains(out.String(), "raise the rate") {
			t.Errorf("Write does not say what to do:\n%s", out.String())
		}
	})
}

func TestWriteSVG(t *testing.T) {
	t.Parallel()
	tr, _ := Pattern("boundary", limit10, 4*time.Second, 1)
	rep, err := Run(context.Background(), tr, Config{Limit: limit10, MaxDelay: time.Second, LeakyBurst: 1})
	if err != nil {
		t.Fatal(err)
	}
	rep.Traffic.Description = `<script>&"` // escaped, not injected
	var out bytes.Buffer
	if err := WriteSVG(&out, rep, 0); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML: one panel per algorithm, each with its line.
	d := xml.NewDecoder(bytes.NewReader(out.Bytes()))
	lines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			for _, a := range se.Attr {
				if a.Name.Local == "stroke-width" {
					lines++
				}
			}
		}
	}
	if lines != len(tollgate.Algorithms()) {
		t.Errorf("%d lines, want one per algorithm", lines)
	}
	if strings.Contains(out.String(), "<script>") {
		t.Error("the description was not escaped")
	}
}

// TestWriteSVGLongTraffic draws traffic far longer than the period with
// the default bin: the bin grows with the span, to a round duration, so
// the chart always has room for its bars, and its time axis keeps to
// about ten labels.
func TestWriteSVGLongTraffic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		span    time.Duration
		wantBin string
	}{
		{20 * time.Second, "100ms"}, // a tenth of the period, as before
		{90 * time.Second, "200ms"},
		{10 * time.Minute, "1s"},
		{2 * time.Hour, "10s"},
		{40 * 24 * time.Hour, "2h"},
	} {
		t.Run(tc.span.String(), func(t *testing.T) {
			t.Parallel()
			// One request every span/500: a few hundred, whatever the span.
			tr := Traffic{Name: "long", Span: tc.span}
			for at := time.Duration(0); at < tc.span; at += tc.span / 500 {
				tr.Times = append(tr.Times, at)
			}
			rep, err := Run(context.Background(), tr, Config{Limit: limit10, MaxDelay: time.Second, LeakyBurst: 1})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := WriteSVG(&out, rep, 0); err != nil {
				t.Fatalf("WriteSVG with the default bin: %v", err)
			}
			want := "offered per " + tc.wantBin + "<" // a count per bin, up to the period
			if d, _ := time.ParseDuration(tc.wantBin); d > time.Second {
				want = "bars: the mean per 1s of each " + tc.wantBin + ";" // past it, the bin's mean per period
			}
			if !strings.Contains(out.String(), want) {
				t.Errorf("the chart's bin is not %s:\n%.600s", tc.wantBin, out.String())
			}
			if n := len(ticks(tc.span)); n > 11 {
				t.Errorf("%d labels on the time axis, want at most 11", n)
			}
		})
	}
	// A bin asked for explicitly is kept, and refused when too fine.
	tr := Traffic{Name: "long", Span: 10 * time.Minute, Times: []time.Duration{0, time.Minute}}
	rep, err := Run(context.Background(), tr, Config{Limit: limit10, MaxDelay: time.Second, LeakyBurst: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSVG(io.Discard, rep, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "use a longer bin") {
		t.Errorf("WriteSVG with a 100ms bin over 10m: %v, want it refused", err)
	}
}

// TestRollingDense draws the line of a day of dense traffic: its path has
// at most one column of commands per tenth of a pixel, the precision of
// its coordinates, however many requests there are; and its peak is kept.
func TestRollingDense(t *testing.T) {
	t.Parallel()
	const span = 24 * time.Hour
	xOf := func(t time.Duration) float64 { return marginLeft + float64(plotW)*float64(t)/float64(span) }
	yOf := func(n int) float64 { return float64(n) }
	rng := rand.New(rand.NewPCG(1, 2))
	times := make([]time.Duration, 300_000)
	for i := range times {
		times[i] = time.Duration(rng.Int64N(int64(span)))
	}
	// A burst of 500 within a millisecond: the peak of the line.
	for i := range 500 {
		times = append(times, 5*time.Hour+time.Duration(i)*time.Microsecond)
	}
	slices.Sort(times)
	peak := 0 // the most in any (t − 1 s, t]
	for i, j := 0, 0; i < len(times); i++ {
		for times[j] <= times[i]-time.Second {
			j++
		}
		peak = max(peak, i-j+1)
	}
	got := rolling(times, time.Second, span, xOf, yOf)
	// Each tenth of a pixel: H and at most three V, of at most 6 bytes each.
	if limit := (10*plotW + 1) * 4 * 6; len(got) > limit {
		t.Errorf("path of %d bytes for %d requests, want at most %d", len(got), len(times), limit)
	}
	top := 0.0
	for _, m := range regexp.MustCompile(`V([0-9.]+)`).FindAllStringSubmatch(got, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		top = max(top, v)
	}
	if top != yOf(peak) {
		t.Errorf("the path peaks at %v, want %d", top, peak)
	}
}

// TestPatternBound: a pattern that would hold more than 5,000,000
// requests (1.5 × rate × span ÷ period, the most of the four) is refused
// before it is made, whichever it is.
func TestPatternBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		l    tollgate.Limit
		span time.Duration
		ok   bool
	}{
		{tollgate.Limit{Rate: 10_000, Period: time.Second}, 20 * time.Second, true},                  // steady: 300,000
		{tollgate.Limit{Rate: 166_667, Period: time.Second}, 20 * time.Second, false},                // 5,000,010
		{tollgate.Limit{Rate: 4_000_000, Period: 365 * 24 * time.Hour}, 365 * 24 * time.Hour, false}, // 6,000,000
	} {
		for _, name := range Patterns {
			tr, err := Pattern(name, tc.l, tc.span, 1)
			if tc.ok != (err == nil) || len(tr.Times) > 5_000_000 {
				t.Errorf("%s, %d per %v over %v: %d requests, error %v", name, tc.l.Rate, tc.l.Period, tc.span, len(tr.Times), err)
			}
			if err != nil && !strings.Contains(err.Error(), "at most 5000000 requests") {
				t.Errorf("%s: error %v does not state the bound", name, err)
			}
		}
	}
}

func TestRolling(t *testing.T) {
	t.Parallel()
	x := func(t time.Duration) float64 { return float64(t / ms) }
	y := func(n int) float64 { return float64(n) }
	// Requests at 0, 200 ms and 1 s with a 1 s period: 1, 2, then at 1 s
	// the first leaves as the third arrives (still 2), 1 at 1.2 s, 0 at 2 s.
	got := rolling([]time.Duration{0, 200 * ms, 1000 * ms}, time.Second, 2500*ms, x, y)
	if want := "M0 0H0V1H200V2H1000V2H1200V1H2000V0H2500"; got != want {
		t.Errorf("rolling = %s, want %s", got, want)
	}
}

func TestTicksAndNiceCeil(t *testing.T) {
	t.Parallel()
	if got := ticks(20 * time.Second); len(got) != 11 || got[1] != 2*time.Second {
		t.Errorf("ticks(20s) = %v, want 0, 2s, … 20s", got)
	}
	for v, want := range map[float64]int{0.5: 1, 1: 1, 11: 15, 18.7: 20, 22: 25, 31: 40, 99: 100, 101: 150} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%v) = %d, want %d", v, got, want)
		}
	}
}

// TestRecommendRateAboveP99: the rate is p99 + 10% rounded up to a whole
// request, computed exactly: 100 a second makes 110, not the 111 that
// 100 × 1.1 = 110.00000000000001 in floating point would round up to.
func TestRecommendRateAboveP99(t *testing.T) {
	t.Parallel()
	for _, p99 := range []int{1, 5, 9, 10, 20, 30, 34, 70, 100, 1000} {
		var tr Traffic
		for s := range 100 {
			for i := range p99 {
				tr.Times = append(tr.Times, time.Duration(s)*time.Second+time.Duration(i)*time.Second/time.Duration(p99))
			}
		}
		tr.Span = 100 * time.Second
		rec, err := Recommend(tr)
		if err != nil {
			t.Fatal(err)
		}
		// The smallest whole rate r with r ≥ 1.1 × p99, that is 10r ≥ 11 p99.
		want := (11*p99 + 9) / 10
		if rec.P99 != p99 || rec.Limit.Rate != want {
			t.Errorf("p99 %d: rate %d, want %d", rec.P99, rec.Limit.Rate, want)
		}
	}
}
