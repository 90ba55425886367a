package headers_test

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
)

// item is one member of a parsed structured-field list.
type item struct {
	Name   string
	Params map[string]any
}

// parseList parses a field with a structured-field parser, as a client
// would, and fails the test when it is not a list of String items.
func parseList(t *testing.T, h http.Header, field string) []item {
	t.Helper()
	values := h.Values(field)
	if len(values) == 0 {
		t.Fatalf("%s missing", field)
	}
	list, err := httpsfv.UnmarshalList(values)
	if err != nil {
		t.Fatalf("%s: %q is not a structured-field list: %v", field, values, err)
	}
	var out []item
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%s: member %#v is not an item", field, m)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%s: item value %#v is not a String", field, it.Value)
		}
		params := map[string]any{}
		for _, k := range it.Params.Names() {
			params[k], _ = it.Params.Get(k)
		}
		out = append(out, item{name, params})
	}
	return out
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestWriteDraftAllowed(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	headers.Write(h, headers.Draft, t0, headers.Decision{
		Policy: "api",
		Result: tollgate.Result{Allowed: true, Limit: tollgate.PerSecond(10), Remaining: 9, ResetAfter: 100 * time.Millisecond},
	})
	if got, want := parseList(t, h, "RateLimit-Policy"), []item{{"api", map[string]any{"q": int64(10), "w": int64(1)}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("RateLimit-Policy = %+v, want %+v", got, want)
	}
	if got, want := parseList(t, h, "RateLimit"), []item{{"api", map[string]any{"r": int64(9), "t": int64(1)}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("RateLimit = %+v, want %+v", got, want)
	}
	if got := h.Get("Retry-After"); got != "" {
		t.Errorf("Retry-After = %q on an allowed request", got)
	}
	for _, f := range []string{"RateLimit-Limit", "X-RateLimit-Limit"} {
		if got := h.Get(f); got != "" {
			t.Errorf("%s = %q, but only the draft flavour was asked for", f, got)
		}
	}
}

func TestWriteRetryAfterRoundsUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retry time.Duration
		want  string
	}{
		{time.Microsecond, "1"},
		{999 * time.Millisecond, "1"},
		{time.Second, "1"},
		{time.Second + time.Microsecond, "2"},
		{59*time.Second + 500*time.Millisecond, "60"},
		{0, "1"}, // a denial never says "come back now"
	} {
		h := http.Header{}
		headers.Write(h, headers.Draft|headers.RateLimitFields, t0, headers.Decision{
			Policy: "api",
			Result: tollgate.Result{Limit: tollgate.PerMinute(60), RetryAfter: tc.retry, ResetAfter: time.Minute},
		})
		if got := h.Get("Retry-After"); got != tc.want {
			t.Errorf("RetryAfter %v: Retry-After = %q, want %q", tc.retry, got, tc.want)
		}
		// t and RateLimit-Reset say the same: the first moment to retry.
		if got := parseList(t, h, "RateLimit")[0].Params["t"]; got != mustInt(t, tc.want) {
			t.Errorf("RetryAfter %v: t = %v, want %s", tc.retry, got, tc.want)
		}
		if got := h.Get("RateLimit-Reset"); got != tc.want {
			t.Errorf("RetryAfter %v: RateLimit-Reset = %q, want %q", tc.retry, got, tc.want)
		}
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	it, err := httpsfv.UnmarshalItem([]string{s})
	if err != nil {
		t.Fatal(err)
	}
	return it.Value.(int64)
}

func TestWriteSeveralPolicies(t *testing.T) {
	t.Parallel()
	burst := tollgate.Limit{Rate: 10, Period: time.Second, Burst: 20}
	daily := tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 10000, Period: 24 * time.Hour}
	trial := tollgate.PerMinute(5)
	ds := []headers.Decision{
		{Policy: "burst", Result: tollgate.Result{Allowed: true, Limit: burst, Remaining: 19, ResetAfter: 100 * time.Millisecond}},
		{Policy: "daily", Result: tollgate.Result{Allowed: true, Limit: daily, Remaining: 3, ResetAfter: 20 * time.Hour}},
		{Policy: "trial", Result: tollgate.Result{Allowed: false, Limit: trial, RetryAfter: 30 * time.Second, ResetAfter: time.Minute}, DryRun: true},
	}
	h := http.Header{}
	headers.Write(h, headers.Draft|headers.RateLimitFields|headers.XRateLimit, t0, ds...)

	wantPolicy := []item{
		{"burst", map[string]any{"q": int64(10), "w": int64(1), "tollgate-burst": int64(20)}},
		{"daily", map[string]any{"q": int64(10000), "w": int64(86400)}},
		{"trial", map[string]any{"q": int64(5), "w": int64(60), "tollgate-dry-run": true}},
	}
	if got := parseList(t, h, "RateLimit-Policy"); !reflect.DeepEqual(got, wantPolicy) {
		t.Errorf("RateLimit-Policy = %+v\nwant %+v", got, wantPolicy)
	}
	wantLimit := []item{
		{"burst", map[string]any{"r": int64(19), "t": int64(1)}},
		{"daily", map[string]any{"r": int64(3), "t": int64(72000)}},
		{"trial", map[string]any{"r": int64(0), "t": int64(30), "tollgate-dry-run": true}},
	}
	if got := parseList(t, h, "RateLimit"); !reflect.DeepEqual(got, wantLimit) {
		t.Errorf("RateLimit = %+v\nwant %+v", got, wantLimit)
	}
	// The single-value flavours report "daily", the binding policy (least
	// remaining); the dry-run denial binds nothing.
	for field, want := range map[string]string{
		"RateLimit-Limit":       "10000",
		"RateLimit-Remaining":   "3",
		"RateLimit-Reset":       "72000",
		"X-RateLimit-Limit":     "10000",
		"X-RateLimit-Remaining": "3",
		"X-RateLimit-Reset":     "1767297600", // 2026-01-01T20:00:00Z
		"Retry-After":           "",
	} {
		if got := h.Get(field); got != want {
			t.Errorf("%s = %q, want %q", field, got, want)
		}
	}
}

func TestBinding(t *testing.T) {
	t.Parallel()
	allowed := func(rem int, reset time.Duration) headers.Decision {
		return headers.Decision{Result: tollgate.Result{Allowed: true, Remaining: rem, ResetAfter: reset}}
	}
	denied := func(retry time.Duration) headers.Decision {
		return headers.Decision{Result: tollgate.Result{RetryAfter: retry}}
	}
	dry := func(d headers.Decision) headers.Decision { d.DryRun = true; return d }
	for _, tc := range []struct {
		name string
		ds   []headers.Decision
		want int
	}{
		{"none", nil, -1},
		{"only dry run", []headers.Decision{dry(denied(time.Second))}, -1},
		{"least remaining", []headers.Decision{allowed(5, time.Second), allowed(2, time.Second), allowed(3, time.Hour)}, 1},
		{"tie: longer reset", []headers.Decision{allowed(2, time.Second), allowed(2, time.Hour)}, 1},
		{"denial beats allowed", []headers.Decision{allowed(0, time.Hour), denied(time.Second)}, 1},
		{"longest denial", []headers.Decision{denied(time.Second), denied(time.Minute), denied(time.Millisecond)}, 1},
		{"dry run never binds", []headers.Decision{allowed(9, time.Second), dry(denied(time.Hour))}, 0},
	} {
		if got := headers.Binding(tc.ds); got != tc.want {
			t.Errorf("%s: Binding = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestQuota(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate   int
		period time.Duration
		q, w   int64
	}{
		{10, time.Second, 10, 1},
		{100, 24 * time.Hour, 100, 86400},
		{5, 500 * time.Millisecond, 10, 1},
		{3, 1500 * time.Millisecond, 4, 2},                      // ⌊3 × 2 / 1.5⌋
		{1, 2500 * time.Millisecond, 1, 3},                      // never 0
		{7, time.Microsecond, 7_000_000, 1},                     // sub-millisecond
		{1 << 52, 1500 * time.Millisecond, 6004799503160661, 2}, // 128-bit product
	} {
		q, w := headers.Quota(tollgate.Limit{Rate: tc.rate, Period: tc.period, Burst: 1})
		if q != tc.q || w != tc.w {
			t.Errorf("%d per %v: q=%d w=%d, want q=%d w=%d", tc.rate, tc.period, q, w, tc.q, tc.w)
		}
	}
	if q, w := headers.Quota(tollgate.Limit{}); q != 0 || w != 0 {
		t.Errorf("zero limit: q=%d w=%d, want 0 0", q, w)
	}
}

// TestQuotaCalendar: a calendar window's w is its unit's longest nominal
// length (a day, 7 days, 31 days), so the policy never promises more than
// the limit admits; the RateLimit field's t says when the window ends.
func TestQuotaCalendar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		unit string
		q, w int64
	}{
		{"day", 500, 86400},
		{"week", 500, 604800},
		{"month", 500, 2678400},
	} {
		l := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 500, Calendar: tollgate.Calendar{Unit: tc.unit, Zone: "Europe/Berlin"}}
		if q, w := headers.Quota(l); q != tc.q || w != tc.w {
			t.Errorf("500 per calendar %s: q=%d w=%d, want q=%d w=%d", tc.unit, q, w, tc.q, tc.w)
		}
	}
}

func TestWritePolicyNameEscaped(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	headers.Write(h, headers.Draft, t0, headers.Decision{
		Policy: "a\"b\\c\u00e9\n",
		Result: tollgate.Result{Allowed: true, Limit: tollgate.PerSecond(1)},
	})
	if got, want := parseList(t, h, "RateLimit")[0].Name, "a\"b\\c___"; got != want {
		t.Errorf("policy name = %q, want %q", got, want)
	}
}

func TestWriteReplacesAndLeavesAlone(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("RateLimit", `"stale";r=1`)
	h.Set("Retry-After", "99")
	h.Set("Content-Type", "text/plain")
	headers.Write(h, headers.Draft, t0, headers.Decision{Policy: "api", Result: tollgate.Result{Limit: tollgate.PerSecond(1), RetryAfter: time.Second}})
	if got := h.Values("RateLimit"); len(got) != 1 || got[0] != `"api";r=0;t=1` {
		t.Errorf("RateLimit = %q, want one fresh value", got)
	}
	if got := h.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	if got := h.Get("Content-Type"); got != "text/plain" {
		t.Errorf("Content-Type changed to %q", got)
	}
	// Adding to a field Write set must not write into its shared storage.
	h.Add("RateLimit", `"other";r=5`)
	if got := h.Values("RateLimit-Policy"); len(got) != 1 {
		t.Errorf("RateLimit-Policy = %q after adding to RateLimit", got)
	}

	empty := http.Header{}
	headers.Write(empty, headers.Draft|headers.RateLimitFields|headers.XRateLimit, t0)
	if len(empty) != 0 {
		t.Errorf("no decisions wrote %v", empty)
	}
}

func TestWriteAllocs(t *testing.T) {
	ds := []headers.Decision{
		{Policy: "burst", Result: tollgate.Result{Allowed: true, Limit: tollgate.PerSecond(10), Remaining: 9, ResetAfter: time.Second}},
		{Policy: "daily", Result: tollgate.Result{Allowed: true, Limit: tollgate.PerDay(10000), Remaining: 99, ResetAfter: time.Hour}},
	}
	vals := new(headers.Values)
	for _, tc := range []struct {
		name  string
		write func(h http.Header)
		want  float64
	}{
		{"Write", func(h http.Header) {
			headers.Write(h, headers.Draft|headers.RateLimitFields|headers.XRateLimit, t0, ds...)
		}, 2},
		{"Values.Write", func(h http.Header) {
			vals.Write(h, headers.Draft|headers.RateLimitFields|headers.XRateLimit, t0, ds...)
		}, 1},
	} {
		h := make(http.Header, 16)
		got := testing.AllocsPerRun(100, func() { tc.write(h) })
		if got > tc.want {
			t.Errorf("%s allocates %v times, want at most %v", tc.name, got, tc.want)
		}
	}
}

// TestValuesWrite: writing through a Values sets the same fields as Write,
// each its own slice without spare capacity, so that adding to one field
// leaves the others alone.
func TestValuesWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    headers.Flavor
		ds   []headers.Decision
	}{
		{"draft, allowed", headers.Draft, []headers.Decision{
			{Policy: "burst", Result: tollgate.Result{Allowed: true, Limit: tollgate.PerSecond(10), Remaining: 9, ResetAfter: time.Second}},
		}},
		{"every flavour, denied", headers.Draft | headers.RateLimitFields | headers.XRateLimit, []headers.Decision{
			{Policy: "burst", Result: tollgate.Result{Allowed: true, Limit: tollgate.PerSecond(10), Remaining: 3, ResetAfter: time.Second}},
			{Policy: "daily", Result: tollgate.Result{Limit: tollgate.PerDay(100), RetryAfter: time.Hour}},
			{Policy: "trial", DryRun: true, Result: tollgate.Result{Limit: tollgate.PerMinute(5), RetryAfter: time.Minute}},
		}},
		{"none", 0, []headers.Decision{
			{Policy: "daily", Result: tollgate.Result{Limit: tollgate.PerDay(100), RetryAfter: time.Hour}},
		}},
	} {
		want, got := http.Header{}, http.Header{}
		headers.Write(want, tc.f, t0, tc.ds...)
		new(headers.Values).Write(got, tc.f, t0, tc.ds...)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Values.Write set %v, want %v as Write sets", tc.name, got, want)
		}
		for name, vs := range got {
			if cap(vs) != 1 {
				t.Errorf("%s: %s has capacity %d, want 1", tc.name, name, cap(vs))
			}
			got.Add(name, "added")
		}
		for name, vs := range got {
			if want := append(want[name], "added"); !reflect.DeepEqual(vs, want) {
				t.Errorf("%s: %s = %q after a value was added to every field, want %q", tc.name, name, vs, want)
			}
		}
	}
}

func TestFlavorNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want headers.Flavor
	}{
		{"draft", headers.Draft},
		{"Draft, X-RateLimit", headers.Draft | headers.XRateLimit},
		{"all", headers.Draft | headers.RateLimitFields | headers.XRateLimit},
		{"none", 0},
		{"ratelimit", headers.RateLimitFields},
	} {
		got, err := headers.ParseFlavor(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseFlavor(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		back, err := headers.ParseFlavor(got.String())
		if err != nil || back != got {
			t.Errorf("ParseFlavor(%q.String() = %q) = %v, %v", tc.in, got.String(), back, err)
		}
	}
	if _, err := headers.ParseFlavor("draft,github"); err == nil {
		t.Error(`ParseFlavor("draft,github") accepted an unknown flavour`)
	}
}

func TestSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d           time.Duration
		s, retryMin int64
	}{
		{-time.Second, 0, 1},
		{0, 0, 1},
		{1, 1, 1},
		{time.Second, 1, 1},
		{1500 * time.Millisecond, 2, 2},
	} {
		if got := headers.Seconds(tc.d); got != tc.s {
			t.Errorf("Seconds(%v) = %d, want %d", tc.d, got, tc.s)
		}
		if got := headers.RetryAfterSeconds(tc.d); got != tc.retryMin {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.retryMin)
		}
	}
}

// The single-value Limit is what Remaining counts down from: Burst for a
// bucket whose burst differs from its rate.
func TestSingleLimitIsBurst(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	headers.Write(h, headers.XRateLimit, t0, headers.Decision{
		Policy: "api",
		Result: tollgate.Result{Allowed: true, Limit: tollgate.Limit{Rate: 10, Period: time.Second, Burst: 20}, Remaining: 19, ResetAfter: 100 * time.Millisecond},
	})
	if got := h.Get("X-RateLimit-Limit"); got != "20" {
		t.Errorf("X-RateLimit-Limit = %q, want 20 (the burst)", got)
	}
}

func TestWriteAnnounced(t *testing.T) {
	t.Parallel()
	from := t0.Add(36 * time.Hour)
	ds := []headers.Decision{
		{Policy: "api", Result: tollgate.Result{Allowed: false, Limit: tollgate.PerMinute(100), RetryAfter: 2 * time.Second, ResetAfter: time.Minute}},
		{Policy: "api:next", Result: tollgate.Result{Limit: tollgate.PerMinute(60)}, From: from},
	}
	h := http.Header{}
	headers.Write(h, headers.Draft|headers.RateLimitFields, t0, ds...)
	wantPolicy := []item{
		{"api", map[string]any{"q": int64(100), "w": int64(60)}},
		{"api:next", map[string]any{"q": int64(60), "w": int64(60), "tollgate-from": from.Unix()}},
	}
	if got := parseList(t, h, "RateLimit-Policy"); !reflect.DeepEqual(got, wantPolicy) {
		t.Errorf("RateLimit-Policy = %+v\nwant %+v", got, wantPolicy)
	}
	// Nothing is spent on an announced limit: RateLimit and the binding
	// decision are the limit in force.
	wantLimit := []item{{"api", map[string]any{"r": int64(0), "t": int64(2)}}}
	if got := parseList(t, h, "RateLimit"); !reflect.DeepEqual(got, wantLimit) {
		t.Errorf("RateLimit = %+v\nwant %+v", got, wantLimit)
	}
	for field, want := range map[string]string{"RateLimit-Limit": "100", "Retry-After": "2"} {
		if got := h.Get(field); got != want {
			t.Errorf("%s = %q, want %q", field, got, want)
		}
	}

	// An announcement alone sets RateLimit-Policy and nothing else.
	h = http.Header{}
	headers.Write(h, headers.Draft|headers.RateLimitFields, t0, ds[1])
	if got, want := len(parseList(t, h, "RateLimit-Policy")), 1; got != want {
		t.Errorf("%d policy items, want %d", got, want)
	}
	for _, field := range []string{"RateLimit", "RateLimit-Limit", "Retry-After"} {
		if got := h.Get(field); got != "" {
			t.Errorf("%s = %q for an announcement alone", field, got)
		}
	}
}

// TestWritePolicyOnly: a decision another stands for (a limit of a set
// that did not decide it) is listed in RateLimit-Policy only, and is never
// binding, even when it has less left.
func TestWritePolicyOnly(t *testing.T) {
	t.Parallel()
	ds := []headers.Decision{
		{Policy: "second", Result: tollgate.Result{Allowed: true, Limit: tollgate.PerSecond(10), Remaining: 1, ResetAfter: time.Second}, PolicyOnly: true},
		{Policy: "day", Result: tollgate.Result{Allowed: true, Limit: tollgate.PerDay(1000), Remaining: 900, ResetAfter: time.Hour}},
	}
	h := http.Header{}
	headers.Write(h, headers.Draft|headers.RateLimitFields, t0, ds...)
	if got := parseList(t, h, "RateLimit-Policy"); len(got) != 2 || got[0].Name != "second" || got[1].Name != "day" {
		t.Errorf("RateLimit-Policy = %+v, want second and day", got)
	}
	wantLimit := []item{{"day", map[string]any{"r": int64(900), "t": int64(3600)}}}
	if got := parseList(t, h, "RateLimit"); !reflect.DeepEqual(got, wantLimit) {
		t.Errorf("RateLimit = %+v\nwant %+v", got, wantLimit)
	}
	if got, want := h.Get("RateLimit-Remaining"), "900"; got != want {
		t.Errorf("RateLimit-Remaining = %q, want %q (day stands for the set)", got, want)
	}
	if got, want := headers.Binding(ds), 1; got != want {
		t.Errorf("Binding = %d, want %d", got, want)
	}
}
