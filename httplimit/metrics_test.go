package httplimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// served is how many requests tollgate_http_request_duration_seconds
// counted under decision, and the sum of their durations.
func served(t *testing.T, reg *prometheus.Registry, decision string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_http_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "decision" && lp.GetValue() == decision {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	t.Fatalf("no series tollgate_http_request_duration_seconds{decision=%q}", decision)
	return 0, 0
}

// deadStore is a Redis store whose server is not there: every call fails
// with connection refused, at once.
func deadStore(t *testing.T) tollgate.Store {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	return redisstore.New(rdb, redisstore.WithPipeline(0, 0))
}

// Every request through the middleware is timed under how it left:
// admitted (the handler ran at once), delayed (after its shaping delay) or
// denied (turned away before the handler), and every rule it reached
// counts its own decision, so that both the latency of throttled and
// unthrottled traffic and the throttle ratio of each rule can be read.
func TestRequestDurationByDecision(t *testing.T) {
	t.Parallel()
	perMinute := []enforce.Policy{{Name: "minute", Limit: tollgate.Limit{Rate: 1, Period: time.Minute, Burst: 1}}}
	shaper := []enforce.Policy{{Name: "drain", Limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 1, MaxDelay: time.Second}}}
	for _, tc := range []struct {
		name     string
		store    func(*testing.T) tollgate.Store
		rules    []httplimit.Rule
		waitErr  error // what the shaping wait returns
		paths    []string
		codes    []int
		want     map[string]uint64 // by decision
		denied   float64           // tollgate_http_decisions_total{rule="r", outcome="denied"}
		reachedR float64           // every decision of rule r
	}{
		{
			name: "no rule applies", rules: []httplimit.Rule{{Name: "r", Pattern: "/api/", Policies: perMinute}},
			paths: []string{"/health", "/health"}, codes: []int{200, 200},
			want: map[string]uint64{"admitted": 2},
		},
		{
			name: "admitted, then over the limit", rules: []httplimit.Rule{{Name: "r", Policies: perMinute}},
			paths: []string{"/a", "/a", "/a"}, codes: []int{200, 429, 429},
			want: map[string]uint64{"admitted": 1, "denied": 2}, denied: 2, reachedR: 3,
		},
		{
			name: "a later rule denies", rules: []httplimit.Rule{
				{Name: "r", Policies: []enforce.Policy{{Name: "lax", Limit: tollgate.PerMinute(100)}}},
				{Name: "strict", Policies: perMinute},
			},
			paths: []string{"/a", "/a"}, codes: []int{200, 429},
			want: map[string]uint64{"admitted": 1, "denied": 1}, reachedR: 2,
		},
		{
			name: "shaped", rules: []httplimit.Rule{{Name: "r", Policies: shaper}},
			paths: []string{"/a", "/a", "/a"}, codes: []int{200, 200, 200},
			want: map[string]uint64{"admitted": 1, "delayed": 2}, reachedR: 3,
		},
		{
			name: "shaped, but the request cannot wait", rules: []httplimit.Rule{{Name: "r", Policies: shaper}},
			waitErr: context.DeadlineExceeded,
			paths:   []string{"/a", "/a"}, codes: []int{200, 503},
			want: map[string]uint64{"admitted": 1, "denied": 1}, reachedR: 2,
		},
		{
			name: "dry run", rules: []httplimit.Rule{{Name: "r", DryRun: true, Policies: perMinute}},
			paths: []string{"/a", "/a"}, codes: []int{200, 200},
			want: map[string]uint64{"admitted": 2}, reachedR: 2,
		},
		{
			name: "costs more than the burst", rules: []httplimit.Rule{{Name: "r", Policies: perMinute, Cost: func(*http.Request) int { return 2 }}},
			paths: []string{"/a"}, codes: []int{413},
			want: map[string]uint64{"denied": 1}, denied: 1, reachedR: 1,
		},
		{
			name: "store down, failing open", store: deadStore,
			rules: []httplimit.Rule{{Name: "r", Policies: perMinute}},
			paths: []string{"/a"}, codes: []int{200},
			want: map[string]uint64{"admitted": 1}, reachedR: 1,
		},
		{
			name: "store down, failing closed", store: deadStore,
			rules: []httplimit.Rule{{Name: "r", Policies: perMinute, FailureMode: enforce.FailClosed}},
			paths: []string{"/a"}, codes: []int{503},
			want: map[string]uint64{"denied": 1}, reachedR: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var store tollgate.Store = memorystore.New(memorystore.WithClock(newClock().Now))
			if tc.store != nil {
				store = tc.store(t)
			}
			reg := prometheus.NewRegistry()
			lim := mustNew(t, store, tc.rules, enforce.WithRegistry(reg), enforce.WithTimeout(time.Second), enforce.WithLogger(slog.New(slog.DiscardHandler)))
			httplimit.SetWait(lim, func(context.Context, time.Duration) error { return tc.waitErr })
			h := lim.Handler(okHandler)
			for i, p := range tc.paths {
				if got, want := do(h, "GET", p, "192.0.2.1:1", nil).Code, tc.codes[i]; got != want {
					t.Errorf("request %d to %s: status %d, want %d", i, p, got, want)
				}
			}
			for _, d := range []string{"admitted", "delayed", "denied"} {
				if got, _ := served(t, reg, d); got != tc.want[d] {
					t.Errorf("request_duration_seconds{decision=%q} count = %d, want %d", d, got, tc.want[d])
				}
			}
			if got, err := testutil.GatherAndCount(reg, "tollgate_http_request_duration_seconds"); err != nil || got != 3 {
				t.Errorf("request_duration_seconds: %d series (%v), want 3, one per decision", got, err)
			}
			if tc.reachedR == 0 {
				return // rule r never applied
			}
			if got := testutil.ToFloat64(decisions(t, reg, "r", "denied")); got != tc.denied {
				t.Errorf("decisions{rule=r,outcome=denied} = %v, want %v", got, tc.denied)
			}
			var reached float64
			for _, o := range []string{"allowed", "denied", "dry_run_denied", "fail_open", "fail_closed"} {
				reached += testutil.ToFloat64(decisions(t, reg, "r", o))
			}
			if reached != tc.reachedR {
				t.Errorf("decisions{rule=r} = %v in all, want %v", reached, tc.reachedR)
			}
		})
	}
}

// The time of an admitted request is the whole request: the limiter's
// decision, and the handler after it.
func TestRequestDurationIncludesHandler(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{{
		Name: "r", Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(1)}},
	}}, enforce.WithRegistry(reg))
	const pause = 30 * time.Millisecond
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { time.Sleep(pause) }))
	do(h, "GET", "/", "192.0.2.1:1", nil)
	if n, sum := served(t, reg, "admitted"); n != 1 || sum < pause.Seconds() {
		t.Errorf("admitted: %d requests taking %vs in all, want 1 taking at least %vs (the handler's pause)", n, sum, pause.Seconds())
	}
}

// A limiter takes at most 256 rules, so that its series are bounded too:
// each rule is some twenty series of the metrics with a rule label.
func TestRuleCountBound(t *testing.T) {
	t.Parallel()
	rules := func(n int) []httplimit.Rule {
		rs := make([]httplimit.Rule, n)
		for i := range rs {
			rs[i] = httplimit.Rule{Name: fmt.Sprint("r", i), Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(1)}}}
		}
		return rs
	}
	for _, tc := range []struct {
		n    int
		fail bool
	}{{1, false}, {256, false}, {257, true}} {
		_, err := httplimit.New(memorystore.New(), rules(tc.n), enforce.WithRegistry(prometheus.NewRegistry()))
		if got := err != nil; got != tc.fail {
			t.Errorf("%d rules: error %v, want an error: %v", tc.n, err, tc.fail)
		}
	}
}
