package service

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// rolloutRules tighten a daily quota from 10 to 5 at from, for an hour,
// tried in shadow until then.
func rolloutRules(from time.Time, percent int) string {
	return fmt.Sprintf(`domain: d
descriptors:
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 10
      rollout:
        requests_per_unit: 5
        percent: %d
        from: %s
        until: %s
        shadow: true
`, percent, from.Format(time.RFC3339), from.Add(time.Hour).Format(time.RFC3339))
}

// TestRolloutAcrossTheSwitch follows one tenant through a rollout on the
// server's clock, on memory and on Redis (whose own clock counts the day):
// announced, then applied on the state the tenant already has, then gone.
func TestRolloutAcrossTheSwitch(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	from := start.Add(time.Hour)
	stores := map[string]func(clock func() time.Time) tollgate.Store{
		"memory": func(clock func() time.Time) tollgate.Store { return memorystore.New(memorystore.WithClock(clock)) },
		"redis":  func(func() time.Time) tollgate.Store { return redisstore.New(redistest.NewServer(t).Client(t)) },
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var now atomic.Pointer[time.Time]
			now.Store(&start)
			clock := func() time.Time { return *now.Load() }
			reg := prometheus.NewRegistry()
			s, err := New(store(clock), WithClock(clock), WithRegistry(reg), WithHeaders(headers.Draft),
				WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				t.Fatal(err)
			}
			rules, err := config.Parse("rules.yaml", []byte(rolloutRules(from, 100)))
			if err != nil {
				t.Fatal(err)
			}
			s.SetRules(rules)
			arm := func(arm, outcome string) float64 {
				return testutil.ToFloat64(s.m.rollouts.WithLabelValues("d", "d.tenant", arm, outcome))
			}
			var resp *pb.RateLimitResponse
			for i := range 7 {
				if resp = ask(t, s, req("d", entries("tenant", "acme"))); resp.OverallCode != pb.RateLimitResponse_OK {
					t.Fatalf("request %d before the switch: %s", i+1, codesOf(resp))
				}
			}
			if got, want := policyField(resp), `"d.tenant";q=10;w=86400, "d.tenant:next";q=5;w=86400;tollgate-from=`+fmt.Sprint(from.Unix()); got != want {
				t.Errorf("before the switch: RateLimit-Policy %q, want %q", got, want)
			}
			if got := resp.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 10 {
				t.Errorf("before the switch: current_limit %d, want 10", got)
			}
			if a, d := arm("shadow", "ok"), arm("shadow", "over_limit"); a != 5 || d != 2 {
				t.Errorf("shadow: %v ok, %v over_limit, want 5 and 2", a, d)
			}
			if got := arm("announced", "ok"); got != 7 {
				t.Errorf("announced: %v ok, want 7", got)
			}

			now.Store(&from)
			resp = ask(t, s, req("d", entries("tenant", "acme")))
			if got, want := codesOf(resp), "OVER_LIMIT: OVER_LIMIT"; got != want {
				t.Errorf("at the switch: %s, want %s (7 spent of the 5 now allowed)", got, want)
			}
			if got := resp.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 5 {
				t.Errorf("at the switch: current_limit %d, want 5", got)
			}
			if got, want := policyField(resp), `"d.tenant";q=5;w=86400`; got != want {
				t.Errorf("at the switch: RateLimit-Policy %q, want %q", got, want)
			}
			if got := arm("rolled", "over_limit"); got != 1 {
				t.Errorf("rolled: %v over_limit, want 1", got)
			}

			end := from.Add(time.Hour)
			now.Store(&end)
			if resp = ask(t, s, req("d", entries("tenant", "acme"))); resp.OverallCode != pb.RateLimitResponse_OK {
				t.Errorf("after the rollout ended: %s, want OK (7 of 10 spent)", codesOf(resp))
			}
			if got := arm("base", "ok"); got != 1 {
				t.Errorf("base: %v ok, want 1", got)
			}
		})
	}
}

// TestRolloutShare: a 10% rollout applies the new limit to 8 to 12% of
// 10,000 tenants, and to the same ones once widened to 30%.
func TestRolloutShare(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // newTestServer's clock: applies at once
	rolled := func(percent int) map[int]bool {
		s := newTestServer(t, rolloutRules(from, percent))
		in := map[int]bool{}
		for i := range 10_000 {
			resp := ask(t, s, req("d", entries("tenant", fmt.Sprint(i))))
			if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 5 {
				in[i] = true
			}
		}
		return in
	}
	ten, thirty := rolled(10), rolled(30)
	if n := len(ten); n < 800 || n > 1200 {
		t.Errorf("10%%: %d of 10,000 tenants under the new limit, want 800 to 1,200", n)
	}
	if n := len(thirty); n < 2400 || n > 3600 {
		t.Errorf("30%%: %d of 10,000 tenants under the new limit", n)
	}
	for i := range ten {
		if !thirty[i] {
			t.Fatalf("tenant %d left the rollout when it grew from 10%% to 30%%", i)
		}
	}
	t.Logf("10%%: %d tenants, 30%%: %d", len(ten), len(thirty))
}

// TestRolloutWidenedByReload widens a rollout from 10% to 30% by a reload
// of the rules file on a running server: every tenant the new limit
// applied to still has it, and every tenant keeps what it had spent (the
// arms share one counter per tenant), whichever arm it ends in.
func TestRolloutWidenedByReload(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // newTestServer's clock: applies at once
	s := newTestServer(t, rolloutRules(from, 10))
	const tenants = 2000
	rolled := map[int]bool{}
	for i := range tenants {
		for range 2 {
			resp := ask(t, s, req("d", entries("tenant", fmt.Sprint(i))))
			if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 5 {
				rolled[i] = true
			}
		}
	}
	if err := s.Update("rules.yaml", func() (*config.Rules, error) {
		return config.Parse("rules.yaml", []byte(rolloutRules(from, 30)))
	}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.m.reloads[reloadSuccess]); got != 1 {
		t.Fatalf("%v successful reloads, want 1", got)
	}
	widened := 0
	for i := range tenants {
		st := ask(t, s, req("d", entries("tenant", fmt.Sprint(i)))).Statuses[0]
		limit := st.CurrentLimit.GetRequestsPerUnit()
		switch {
		case rolled[i] && limit != 5:
			t.Fatalf("tenant %d left the rollout when it was widened by a reload", i)
		case limit == 5 && !rolled[i]:
			widened++
		}
		// Three spent, before and after the reload, under either limit.
		if got, want := st.LimitRemaining, limit-3; got != want {
			t.Fatalf("tenant %d after the reload: %d remaining of %d, want %d (its two requests before the reload kept)", i, got, limit, want)
		}
	}
	if n := len(rolled) + widened; n < 480 || n > 720 {
		t.Errorf("after widening to 30%%: %d of %d tenants under the new limit", n, tenants)
	}
	t.Logf("10%%: %d tenants; the reload to 30%% added %d", len(rolled), widened)
}

// policyField is the RateLimit-Policy of resp's response_headers_to_add.
func policyField(resp *pb.RateLimitResponse) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if strings.EqualFold(h.Key, "RateLimit-Policy") {
			return h.Value
		}
	}
	return ""
}
