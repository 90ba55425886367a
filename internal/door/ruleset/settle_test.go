package ruleset_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/ruleset"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

func TestParseCost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     []string
		want   int
		wantOK bool
		err    error
	}{
		{nil, 0, false, nil},
		{[]string{"0"}, 0, true, nil},
		{[]string{"42"}, 42, true, nil},
		{[]string{" 42\t"}, 42, true, nil},
		{[]string{"007"}, 7, true, nil},
		{[]string{"9007199254740991"}, 1<<53 - 1, true, nil},
		{[]string{"9007199254740992"}, 0, true, ruleset.ErrCostTooLarge},
		{[]string{"99999999999999999999999"}, 0, true, ruleset.ErrCostTooLarge},
		{[]string{"1", "2"}, 0, true, ruleset.ErrCostSeveral},
		{[]string{"1,2"}, 0, true, ruleset.ErrCostSeveral},
		{[]string{""}, 0, true, ruleset.ErrCostNotCount},
		{[]string{"-1"}, 0, true, ruleset.ErrCostNotCount},
		{[]string{"+1"}, 0, true, ruleset.ErrCostNotCount},
		{[]string{"1.5"}, 0, true, ruleset.ErrCostNotCount},
		{[]string{"1e3"}, 0, true, ruleset.ErrCostNotCount},
		{[]string{"0x10"}, 0, true, ruleset.ErrCostNotCount},
		{[]string{"１"}, 0, true, ruleset.ErrCostNotCount}, // a full-width digit
	} {
		got, ok, err := ruleset.ParseCost(tc.in)
		if got != tc.want || ok != tc.wantOK || !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("ParseCost(%q) = %d, %v, %v; want %d, %v, %v", tc.in, got, ok, err, tc.want, tc.wantOK, tc.err)
		}
	}
}

// settleRules makes rules over requests of type int (the request's
// estimate) that settle under a token bucket of 10 a minute, keyed by one
// tenant, then a rule that denies a request of estimate 3.
func settleRules(t *testing.T, store tollgate.Store, opts ...enforce.Option) *ruleset.Rules[int] {
	t.Helper()
	key := ruleset.FuncKey("tenant", func(int) (string, bool) { return "t1", true })
	rules, err := ruleset.NewRules("test", "t", store, key, []ruleset.Spec[int]{
		{
			Name:     "tokens",
			Policies: []enforce.Policy{{Name: "minute", Limit: tollgate.PerMinute(10)}, {Name: "hour", Limit: tollgate.PerHour(100)}},
			Cost:     func(n int) int { return n },
			Settles:  true,
		},
		{
			Name:     "never3",
			Applies:  func(n int) bool { return n == 3 },
			Policies: []enforce.Policy{{Name: "none", Limit: tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 1}}},
			Cost:     func(int) int { return 2 }, // more than the burst: always denied
		},
	}, ruleset.Resolve(opts))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// look returns what is left of the two policies after a request of
// estimate 1 (settled back to 0).
func look(t *testing.T, rules *ruleset.Rules[int]) (minute, hour int) {
	t.Helper()
	s := new(ruleset.Scratch)
	v, ds := rules.Decide(context.Background(), 1, nil, s)
	if v.Outcome != engine.Allowed || len(ds) != 2 {
		t.Fatalf("look: %v, %d decisions", v.Outcome, len(ds))
	}
	rules.Settle(context.Background(), s, func(int) (int, bool, error) { return 0, true, nil })
	if err := rules.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ds[0].Result.Remaining + 1, ds[1].Result.Remaining + 1
}

// TestRulesSettle: every policy that admitted a request is settled to the
// real cost; a request another rule turns away is refunded; a bad cost
// leaves the estimate, counted.
func TestRulesSettle(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		estimate         int
		actual           func(int) (int, bool, error)
		minute, hour     int // left after the request
		blocked          bool
		bad, actualCalls int
	}{
		{"refund", 4, func(int) (int, bool, error) { return 0, true, nil }, 10, 100, false, 0, 1},
		{"less", 4, func(int) (int, bool, error) { return 1, true, nil }, 9, 99, false, 0, 1},
		{"more", 4, func(int) (int, bool, error) { return 7, true, nil }, 3, 93, false, 0, 1},
		{"unknown", 4, func(int) (int, bool, error) { return 0, false, nil }, 6, 96, false, 0, 1},
		{"bad", 4, func(int) (int, bool, error) { return 0, false, ruleset.ErrCostNotCount }, 6, 96, false, 1, 1},
		{"negative", 4, func(int) (int, bool, error) { return -2, true, nil }, 6, 96, false, 1, 1},
		{"blocked by another rule", 3, nil, 10, 100, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			rules := settleRules(t, memorystore.New(), enforce.WithRegistry(reg), enforce.WithLogger(slog.New(&testkit.Logs{})))
			s := new(ruleset.Scratch)
			v, _ := rules.Decide(context.Background(), tc.estimate, nil, s)
			if got := v.Outcome.Blocks(); got != tc.blocked {
				t.Fatalf("outcome %v; blocks: %v, want %v", v.Outcome, got, tc.blocked)
			}
			calls := 0
			if !tc.blocked {
				rules.Settle(context.Background(), s, func(rule int) (int, bool, error) {
					calls++
					if rule != 0 {
						t.Errorf("actual asked for rule %d, want 0", rule)
					}
					return tc.actual(rule)
				})
			}
			if err := rules.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			if calls != tc.actualCalls {
				t.Errorf("actual called %d times, want %d (once per rule)", calls, tc.actualCalls)
			}
			if minute, hour := look(t, rules); minute != tc.minute || hour != tc.hour {
				t.Errorf("left %d a minute, %d an hour; want %d and %d", minute, hour, tc.minute, tc.hour)
			}
			m, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var bad float64
			for _, mf := range m {
				if mf.GetName() == "tollgate_t_bad_costs_total" {
					for _, s := range mf.GetMetric() {
						bad += s.GetCounter().GetValue()
					}
				}
			}
			if bad != float64(tc.bad) {
				t.Errorf("bad_costs_total = %v, want %d", bad, tc.bad)
			}
		})
	}
}

// TestRulesSettleNeedsSettler: a rule that settles on a store that is not
// a tollgate.Settler is refused, naming the store.
func TestRulesSettleNeedsSettler(t *testing.T) {
	t.Parallel()
	type plainStore struct{ tollgate.Store }
	_, err := ruleset.NewRules("test", "t", plainStore{memorystore.New()}, ruleset.GlobalKey[int](), []ruleset.Spec[int]{
		{Name: "tokens", Policies: []enforce.Policy{{Name: "minute", Limit: tollgate.PerMinute(10)}}, Settles: true},
	}, ruleset.Resolve(nil))
	if err == nil || !strings.HasPrefix(err.Error(), "test: ") || !strings.Contains(err.Error(), "plainStore cannot settle") {
		t.Errorf("NewRules: %v, want a refusal naming the store", err)
	}
}

// TestSettleStepFails: a settle is a store call like any other: with Redis
// paused it gives up at the deadline, counted as a timeout (or an error
// without a Timeouts counter) and logged with what happened instead.
func TestSettleStepFails(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	defer srv.Resume()
	logs := &testkit.Logs{}
	e := ruleset.New(redisstore.New(srv.Client(t)), enforce.WithTimeout(2*time.Second), enforce.WithLogger(slog.New(logs)))
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "errors"})
	timeouts := prometheus.NewCounter(prometheus.CounterOpts{Name: "timeouts"})
	p := &engine.Point{Rule: "tokens", Errors: errs, Timeouts: timeouts}
	limit := tollgate.PerMinute(10)

	q := e.Begin(context.Background())
	st, at := q.Reserve(p, "minute", "k", limit, 4)
	q.End()
	if st.Outcome != engine.Allowed || at <= 0 {
		t.Fatalf("Reserve: %v, at %d", st.Outcome, at)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	q = e.Begin(context.WithoutCancel(context.Background()))
	err := q.Settle(p, "minute", "k", limit, at, 4, 1)
	q.End()
	if err == nil {
		t.Fatal("Settle with Redis paused succeeded")
	}
	if got := testutil.ToFloat64(timeouts); got != 1 {
		t.Errorf("timeouts = %v, want 1", got)
	}
	if got := testutil.ToFloat64(errs); got != 0 {
		t.Errorf("errors = %v, want 0 (a timeout)", got)
	}
	recs := logs.Records()
	if len(recs) != 1 {
		t.Fatalf("%d log records, want 1", len(recs))
	}
	var outcome string
	recs[0].Attrs(func(a slog.Attr) bool {
		if a.Key == "outcome" {
			outcome = a.Value.String()
		}
		return true
	})
	if outcome != "estimate_stands" {
		t.Errorf("logged outcome %q, want estimate_stands", outcome)
	}
}
