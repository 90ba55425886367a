package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/internal/test/promtest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// TestRolloutAcrossTheSwitch: a tighter limit is announced in the
// ratelimit-policy metadata until its instant on the door's clock, then
// applies on the state the caller already has.
func TestRolloutAcrossTheSwitch(t *testing.T) {
	t.Parallel()
	for _, b := range testkit.Stores(server.Client) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			from := c.Now().Add(time.Hour)
			daily := func(n int) tollgate.Limit {
				return tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: n, Period: 24 * time.Hour}
			}
			reg := prometheus.NewRegistry()
			lim := mustNew(t, b.New(t, c.Now), []grpclimit.Rule{{
				Name:   "health",
				Method: "/grpc.health.v1.Health/Check",
				Policies: []enforce.Policy{{Name: "daily", Limit: daily(3), Rollout: &enforce.Rollout{
					Limit: daily(2), Percent: 100, From: from,
				}}},
			}}, grpclimit.WithClock(c.Now), enforce.WithRegistry(reg))
			h := serve(t, lim)
			ctx := context.Background()
			for i := range 2 {
				md, err := check(ctx, h, nil)
				if err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
				list, err := httpsfv.UnmarshalList(md.Get("ratelimit-policy"))
				if err != nil || len(list) != 2 {
					t.Fatalf("call %d: ratelimit-policy %q (%v), want the limit and the one announced", i+1, md.Get("ratelimit-policy"), err)
				}
				next := list[1].(httpsfv.Item)
				if f, _ := next.Params.Get("tollgate-from"); next.Value != "daily:next" || f != from.Unix() {
					t.Errorf("call %d: announced %q, want daily:next from %d", i+1, md.Get("ratelimit-policy"), from.Unix())
				}
			}
			c.Set(from)
			if _, err := check(ctx, h, nil); status.Code(err) != codes.ResourceExhausted {
				t.Errorf("at the switch: %v, want RESOURCE_EXHAUSTED (2 spent of the 2 now allowed)", err)
			}
			// Each arm's calls are timed apart, by decision.
			for _, tc := range []struct {
				arm, decision string
				want          uint64
			}{{"announced", "admitted", 2}, {"rolled", "denied", 1}, {"rolled", "admitted", 0}} {
				got := promtest.HistogramCount(t, reg, "tollgate_grpc_rollout_request_duration_seconds",
					map[string]string{"rule": "health", "policy": "daily", "arm": tc.arm, "decision": tc.decision})
				if got != tc.want {
					t.Errorf("rollout_request_duration_seconds{arm=%q, decision=%q}: %d calls, want %d", tc.arm, tc.decision, got, tc.want)
				}
			}
		})
	}
}
