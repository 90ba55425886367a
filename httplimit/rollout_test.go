package httplimit_test

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/internal/test/promtest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
)

// TestRolloutAcrossTheSwitch tightens a daily quota from 10 to 5 at an
// instant, for one day: announced before, applied from it (on the state
// the key already has), gone after. The door's clock decides the switch;
// the store counts on its own (Redis: its TIME).
func TestRolloutAcrossTheSwitch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		c := newClock()
		from := c.Now().Add(time.Hour)
		daily := func(n int) tollgate.Limit {
			return tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: n, Period: 24 * time.Hour}
		}
		reg := prometheus.NewRegistry()
		lim := mustNew(t, b.New(t, c.Now), []httplimit.Rule{{
			Name: "api",
			Policies: []enforce.Policy{{Name: "daily", Limit: daily(10), Rollout: &enforce.Rollout{
				Limit: daily(5), Percent: 100, From: from, Until: from.Add(time.Minute), Shadow: true,
			}}},
		}}, enforce.WithRegistry(reg), httplimit.WithClock(c.Now))
		h := lim.Handler(okHandler)
		arm := func(arm, outcome string) float64 {
			return testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_rollout_decisions_total",
				map[string]string{"rule": "api", "policy": "daily", "arm": arm, "outcome": outcome}))
		}

		var w *httptest.ResponseRecorder
		for i := range 7 {
			if w = do(h, "GET", "/", "192.0.2.1:1", nil); w.Code != 200 {
				t.Fatalf("request %d before the switch: %d, want 200 (10 a day)", i+1, w.Code)
			}
		}
		got := parseSF(t, w.Header(), "RateLimit-Policy")
		want := []sfItem{
			{"daily", map[string]any{"q": int64(10), "w": int64(86400)}},
			{"daily:next", map[string]any{"q": int64(5), "w": int64(86400), "tollgate-from": from.Unix()}},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("before the switch: RateLimit-Policy = %v, want %v", got, want)
		}
		if r := remaining(t, w.Header(), "daily"); r != 3 {
			t.Errorf("before the switch: r = %d, want 3", r)
		}
		// The shadow tried 5 a day on a state of its own: 5 in, 2 out.
		if a, d := arm("shadow", "allowed"), arm("shadow", "denied"); a != 5 || d != 2 {
			t.Errorf("shadow: %v allowed, %v denied, want 5 and 2", a, d)
		}
		if a := arm("announced", "allowed"); a != 7 {
			t.Errorf("announced: %v allowed, want 7", a)
		}

		c.Set(from)
		w = do(h, "GET", "/", "192.0.2.1:1", nil)
		if w.Code != 429 {
			t.Fatalf("at the switch: %d, want 429 (7 spent of the 5 now allowed)", w.Code)
		}
		got = parseSF(t, w.Header(), "RateLimit-Policy")
		if want := []sfItem{{"daily", map[string]any{"q": int64(5), "w": int64(86400)}}}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("at the switch: RateLimit-Policy = %v, want %v", got, want)
		}
		if d := arm("rolled", "denied"); d != 1 {
			t.Errorf("rolled: %v denied, want 1", d)
		}

		c.Set(from.Add(time.Minute)) // Until: the old limit is back
		if w = do(h, "GET", "/", "192.0.2.1:1", nil); w.Code != 200 {
			t.Errorf("after the rollout ended: %d, want 200 (7 of 10 spent)", w.Code)
		}
		if a := arm("base", "allowed"); a != 1 {
			t.Errorf("base: %v allowed, want 1", a)
		}
		// Each arm's requests are timed apart, by decision.
		for _, tc := range []struct {
			arm, decision string
			want          uint64
		}{{"announced", "admitted", 7}, {"rolled", "denied", 1}, {"base", "admitted", 1}, {"rolled", "admitted", 0}} {
			got := promtest.HistogramCount(t, reg, "tollgate_http_rollout_request_duration_seconds",
				map[string]string{"rule": "api", "policy": "daily", "arm": tc.arm, "decision": tc.decision})
			if got != tc.want {
				t.Errorf("rollout_request_duration_seconds{arm=%q, decision=%q}: %d requests, want %d", tc.arm, tc.decision, got, tc.want)
			}
		}
	})
}

// TestRolloutShare announces a rollout to half the clients: each client's
// arm is a stable hash of its key, so about half of 200 see it, and the
// same ones on every request.
func TestRolloutShare(t *testing.T) {
	t.Parallel()
	c := newClock()
	lim := mustNew(t, memorystore.New(memorystore.WithClock(c.Now)), []httplimit.Rule{{
		Name: "api",
		Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(100), Rollout: &enforce.Rollout{
			Limit: tollgate.PerMinute(50), Percent: 50, From: c.Now().Add(time.Hour),
		}}},
	}}, httplimit.WithClock(c.Now))
	h := lim.Handler(okHandler)
	announced := func(ip string) bool {
		return len(parseSF(t, do(h, "GET", "/", ip+":1", nil).Header(), "RateLimit-Policy")) == 2
	}
	n := 0
	for i := range 200 {
		ip := fmt.Sprintf("198.51.%d.%d", i/100, i%100+1)
		a := announced(ip)
		if announced(ip) != a {
			t.Fatalf("%s: announced once and not the next time", ip)
		}
		if a {
			n++
		}
	}
	if n < 60 || n > 140 {
		t.Errorf("%d of 200 clients see the announcement, want about half", n)
	}
}
