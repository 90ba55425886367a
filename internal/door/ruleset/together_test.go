package ruleset_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/ruleset"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// left looks at what key has left under l, spending nothing.
func left(t *testing.T, s tollgate.Store, key string, l tollgate.Limit) int {
	t.Helper()
	res, err := s.AllowN(context.Background(), key, l, 0)
	if err != nil {
		t.Fatal(err)
	}
	return res.Remaining
}

// TestPoliciesTogether: a rule's policies are decided all or nothing on a
// store that is a tollgate.Combiner: a request any policy denies spends
// none of them, every policy answers, and the verdict names the one that
// decided.
func TestPoliciesTogether(t *testing.T) {
	t.Parallel()
	burst := tollgate.Limit{Rate: 2, Period: time.Second, Burst: 2}
	hourly := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: time.Hour}
	slow := tollgate.Limit{Rate: 1, Period: time.Second, Burst: 2}
	hourly5 := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: time.Hour}
	pen := &enforce.Penalty{For: 15 * time.Minute}
	for _, tc := range []struct {
		name     string
		policies []enforce.Policy
		dryRun   bool
		// each request is sent a second after the one before, at cost
		cost     int
		outcomes []engine.Outcome
		policy   string // that decided the last
		retry    time.Duration
		left     []int // each policy's, after the requests, at the last one's instant
		// penalized: the last request was denied by a running penalty,
		// which is reported alone
		penalized bool
	}{
		{
			name:     "hourly denies, burst unspent",
			policies: []enforce.Policy{{Name: "burst", Limit: burst}, {Name: "hourly", Limit: hourly}},
			cost:     1,
			outcomes: []engine.Outcome{engine.Allowed, engine.Allowed, engine.Allowed, engine.Denied, engine.Denied},
			policy:   "hourly", retry: time.Hour - 4*time.Second, left: []int{2, 0},
		},
		{
			name:     "burst denies, hourly unspent",
			policies: []enforce.Policy{{Name: "burst", Limit: slow}, {Name: "hourly", Limit: hourly5}},
			cost:     2,
			outcomes: []engine.Outcome{engine.Allowed, engine.Denied},
			policy:   "burst", retry: time.Second, left: []int{1, 3},
		},
		{
			name:     "dry run spends nothing when one would deny",
			policies: []enforce.Policy{{Name: "hourly", Limit: hourly}, {Name: "burst", Limit: burst}},
			dryRun:   true,
			cost:     2,
			outcomes: []engine.Outcome{engine.Allowed, engine.DryRunDenied, engine.DryRunDenied},
			policy:   "hourly", retry: time.Hour - 2*time.Second, left: []int{1, 2},
		},
		{
			name:     "penalty: the denial starts it, then it denies before anything is spent",
			policies: []enforce.Policy{{Name: "hourly", Limit: hourly, Penalty: pen}, {Name: "burst", Limit: burst}},
			cost:     1,
			outcomes: []engine.Outcome{engine.Allowed, engine.Allowed, engine.Allowed, engine.Denied, engine.Denied},
			policy:   "hourly", retry: 15*time.Minute - time.Second, left: []int{0, 2}, penalized: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := testkit.NewClock(t0)
			store := memorystore.New(memorystore.WithClock(c.Now))
			r, err := ruleset.New(store, ruleset.WithClock(c.Now)).Rule("r", enforce.FailOpen, tc.dryRun)
			if err != nil {
				t.Fatal(err)
			}
			var v ruleset.Verdict
			for i, want := range tc.outcomes {
				if i > 0 {
					c.Advance(time.Second)
				}
				var ds []headers.Decision
				v, ds = r.Decide(ctx, "k", tc.policies, tc.cost, nil)
				if v.Outcome != want || v.Err != nil {
					t.Fatalf("request %d: %v (%v), want %v", i, v.Outcome, v.Err, want)
				}
				want := len(tc.policies)
				if tc.penalized && i == len(tc.outcomes)-1 {
					want = 1
				}
				if len(ds) != want {
					t.Fatalf("request %d: %d decisions, want %d", i, len(ds), want)
				}
			}
			if v.Policy != tc.policy {
				t.Errorf("the last verdict names %q, want %q", v.Policy, tc.policy)
			}
			if want := tc.outcomes[len(tc.outcomes)-1]; want != engine.Allowed && v.Result.RetryAfter != tc.retry {
				t.Errorf("the last RetryAfter %v, want %v", v.Result.RetryAfter, tc.retry)
			}
			for i, p := range tc.policies {
				if got := left(t, store, "k", p.Limit); got != tc.left[i] {
					t.Errorf("%s has %d left, want %d", p.Name, got, tc.left[i])
				}
			}
		})
	}
}

// TestPoliciesTogetherCost: a cost above what one policy can ever admit
// is denied with ErrCostExceedsBurst before any store call: nothing spent.
func TestPoliciesTogetherCost(t *testing.T) {
	t.Parallel()
	store := memorystore.New()
	r, err := ruleset.New(store).Rule("r", enforce.FailOpen, false)
	if err != nil {
		t.Fatal(err)
	}
	small := tollgate.Limit{Rate: 2, Period: time.Second, Burst: 2}
	day := tollgate.PerDay(100)
	v, ds := r.Decide(context.Background(), "k", []enforce.Policy{{Name: "day", Limit: day}, {Name: "small", Limit: small}}, 3, nil)
	if v.Outcome != engine.Denied || !errors.Is(v.Err, tollgate.ErrCostExceedsBurst) || v.Policy != "small" || len(ds) != 0 {
		t.Errorf("cost 3 over burst 2: %+v, %d decisions; want denied by small, ErrCostExceedsBurst, none", v, len(ds))
	}
	if got := left(t, store, "k", day); got != 100 {
		t.Errorf("day has %d left, want 100", got)
	}
}

// TestPoliciesInOrder: on a store that cannot decide a set (no
// tollgate.Combiner), policies spend in order up to the first denial,
// which is documented: the earlier ones keep what they spent.
func TestPoliciesInOrder(t *testing.T) {
	t.Parallel()
	mem := memorystore.New()
	r, err := ruleset.New(struct{ tollgate.Store }{mem}).Rule("r", enforce.FailOpen, false)
	if err != nil {
		t.Fatal(err)
	}
	day, small := tollgate.PerDay(100), tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 1}
	policies := []enforce.Policy{{Name: "day", Limit: day}, {Name: "small", Limit: small}}
	for i, want := range []engine.Outcome{engine.Allowed, engine.Denied} {
		if v, _ := r.Decide(context.Background(), "k", policies, 1, nil); v.Outcome != want {
			t.Fatalf("request %d: %v, want %v", i, v.Outcome, want)
		}
	}
	if got := left(t, mem, "k", day); got != 98 {
		t.Errorf("day has %d left, want 98 (spent in order, before small denied)", got)
	}
}

// TestPoliciesTogetherConcurrent: many goroutines of two instances send
// one rule's requests to one Redis at one instant; the hourly window
// admits 7, and the burst (10) must have spent exactly those 7, no more:
// a request the window denied spent nothing of the burst.
func TestPoliciesTogetherConcurrent(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	c := testkit.NewClock(t0)
	burst := tollgate.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	hourly := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 7, Period: time.Hour}
	policies := []enforce.Policy{{Name: "burst", Limit: burst}, {Name: "hourly", Limit: hourly}}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		store := redisstore.New(srv.Client(t), redisstore.WithClock(c.Now))
		// A deadline far from the default's 50 ms: a busy machine's
		// scheduling is no store failure here.
		r, err := ruleset.New(store, enforce.WithTimeout(10*time.Second)).Rule("r", enforce.FailClosed, false)
		if err != nil {
			t.Fatal(err)
		}
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 5 {
					v, _ := r.Decide(context.Background(), "k", policies, 1, nil)
					switch v.Outcome {
					case engine.Allowed:
						admitted.Add(1)
					case engine.Denied:
					default:
						t.Errorf("outcome %v (%v)", v.Outcome, v.Err)
					}
				}
			}()
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != 7 {
		t.Errorf("%d of 80 admitted, want 7", got)
	}
	store := redisstore.New(srv.Client(t), redisstore.WithClock(c.Now))
	if got := left(t, store, "k", burst); got != 3 {
		t.Errorf("burst has %d left, want 3 (only the 7 admitted spent it)", got)
	}
}
