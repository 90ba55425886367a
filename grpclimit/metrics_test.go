package grpclimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// served is how many calls tollgate_grpc_request_duration_seconds counted
// under decision.
func served(t *testing.T, reg *prometheus.Registry, decision string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_grpc_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "decision" && lp.GetValue() == decision {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	t.Fatalf("no series tollgate_grpc_request_duration_seconds{decision=%q}", decision)
	return 0
}

// grpcDecisions is tollgate_grpc_decisions_total{rule, outcome}.
func grpcDecisions(t *testing.T, reg *prometheus.Registry, rule, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_grpc_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var r, o string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "rule":
					r = lp.GetValue()
				case "outcome":
					o = lp.GetValue()
				}
			}
			if r == rule && o == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series tollgate_grpc_decisions_total{rule=%q,outcome=%q}", rule, outcome)
	return 0
}

// Unary calls are timed by how they left the interceptor: admitted,
// delayed (after their shaping delay) or denied. A stream is decided and
// counted when it opens, but not timed: its life is not a latency.
func TestRequestDurationByDecision(t *testing.T) {
	t.Parallel()
	const check = "/grpc.health.v1.Health/Check"
	perMinute := []enforce.Policy{{Name: "minute", Limit: tollgate.Limit{Rate: 1, Period: time.Minute, Burst: 1}}}
	shaper := func(rate int) []enforce.Policy {
		return []enforce.Policy{{Name: "drain", Limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: rate, Period: time.Second, Burst: 1, MaxDelay: 10 * time.Second}}}
	}
	dead := func(t *testing.T) tollgate.Store {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { _ = rdb.Close() })
		return redisstore.New(rdb, redisstore.WithPipeline(0, 0))
	}
	for _, tc := range []struct {
		name    string
		store   func(*testing.T) tollgate.Store
		rules   []grpclimit.Rule
		calls   int
		timeout time.Duration // of each call; 0: none
		watch   bool          // open a Watch stream after the calls
		codes   []codes.Code
		want    map[string]uint64 // by decision
		reached float64           // decisions of rule r
	}{
		{
			name: "no rule applies", rules: []grpclimit.Rule{{Name: "r", Method: "/other.Service/*", Policies: perMinute}},
			calls: 2, codes: []codes.Code{codes.OK, codes.OK},
			want: map[string]uint64{"admitted": 2},
		},
		{
			name: "admitted, then over the limit", rules: []grpclimit.Rule{{Name: "r", Method: check, Policies: perMinute}},
			calls: 3, codes: []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted},
			want: map[string]uint64{"admitted": 1, "denied": 2}, reached: 3,
		},
		{
			name: "shaped", rules: []grpclimit.Rule{{Name: "r", Policies: shaper(100)}},
			calls: 2, codes: []codes.Code{codes.OK, codes.OK},
			want: map[string]uint64{"admitted": 1, "delayed": 1}, reached: 2,
		},
		{
			// Its turn is a second away, its deadline 300 ms: it gives up at once.
			name: "shaped, but the call cannot wait", rules: []grpclimit.Rule{{Name: "r", Policies: shaper(1)}},
			calls: 2, timeout: 300 * time.Millisecond, codes: []codes.Code{codes.OK, codes.DeadlineExceeded},
			want: map[string]uint64{"admitted": 1, "denied": 1}, reached: 2,
		},
		{
			name: "store down, failing closed", store: dead,
			rules: []grpclimit.Rule{{Name: "r", Policies: perMinute, FailureMode: enforce.FailClosed}},
			calls: 1, codes: []codes.Code{codes.Unavailable},
			want: map[string]uint64{"denied": 1}, reached: 1,
		},
		{
			name: "a stream is counted, not timed", rules: []grpclimit.Rule{{Name: "r", Policies: perMinute}},
			calls: 1, watch: true, codes: []codes.Code{codes.OK},
			want: map[string]uint64{"admitted": 1}, reached: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var store tollgate.Store = memorystore.New()
			if tc.store != nil {
				store = tc.store(t)
			}
			reg := prometheus.NewRegistry()
			c := serve(t, mustNew(t, store, tc.rules, enforce.WithRegistry(reg), enforce.WithTimeout(time.Second),
				enforce.WithLogger(slog.New(slog.DiscardHandler))))
			for i := range tc.calls {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.timeout > 0 {
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				}
				_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
				cancel()
				if got, want := status.Code(err), tc.codes[i]; got != want {
					t.Errorf("call %d: %v, want %v", i, err, want)
				}
			}
			if tc.watch {
				ctx, cancel := context.WithCancel(context.Background())
				w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
				if err == nil {
					_, err = w.Recv()
				}
				cancel()
				if got := status.Code(err); got != codes.ResourceExhausted {
					t.Errorf("Watch after the minute's call: %v, want RESOURCE_EXHAUSTED", err)
				}
			}
			for _, d := range []string{"admitted", "delayed", "denied"} {
				if got := served(t, reg, d); got != tc.want[d] {
					t.Errorf("request_duration_seconds{decision=%q} count = %d, want %d", d, got, tc.want[d])
				}
			}
			if got, err := testutil.GatherAndCount(reg, "tollgate_grpc_request_duration_seconds"); err != nil || got != 3 {
				t.Errorf("request_duration_seconds: %d series (%v), want 3, one per decision", got, err)
			}
			var reached float64
			for _, o := range []string{"allowed", "denied", "dry_run_denied", "fail_open", "fail_closed"} {
				reached += grpcDecisions(t, reg, "r", o)
			}
			if reached != tc.reached {
				t.Errorf("decisions{rule=r} = %v in all, want %v", reached, tc.reached)
			}
		})
	}
}

// A limiter takes at most 256 rules, so that the series labelled by rule
// are bounded too.
func TestRuleCountBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int
		fail bool
	}{{1, false}, {256, false}, {257, true}} {
		rules := make([]grpclimit.Rule, tc.n)
		for i := range rules {
			rules[i] = grpclimit.Rule{Name: fmt.Sprint("r", i), Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(1)}}}
		}
		_, err := grpclimit.New(memorystore.New(), rules, enforce.WithRegistry(prometheus.NewRegistry()))
		if got := err != nil; got != tc.fail {
			t.Errorf("%d rules: error %v, want an error: %v", tc.n, err, tc.fail)
		}
	}
}
