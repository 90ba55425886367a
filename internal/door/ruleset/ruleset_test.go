package ruleset_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/ruleset"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

type ctxKey struct{}

// TestSharedDeadline: the engine bounds decisions with its timeout through
// internal/guard (tested there), or by a sooner deadline of the caller's.
func TestSharedDeadline(t *testing.T) {
	t.Parallel()
	e := ruleset.New(memorystore.New(), enforce.WithTimeout(80*time.Millisecond))
	parent := context.WithValue(context.Background(), ctxKey{}, "trace-1")
	start := time.Now()
	ctx, done := e.Deadline(parent)
	defer done()
	dl, ok := ctx.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	// 81 ms at most, and slack for a loaded machine.
	if left := dl.Sub(start); left < 80*time.Millisecond || left > 90*time.Millisecond {
		t.Errorf("deadline %v after the start, want between 80ms and 81ms", left)
	}
	if got := ctx.Value(ctxKey{}); got != "trace-1" {
		t.Errorf("request value lost: %v", got)
	}
	// A request whose own deadline is sooner is answered by it.
	soon, cancel := context.WithTimeout(parent, 20*time.Millisecond)
	defer cancel()
	callerDL, _ := soon.Deadline()
	ctx, done = e.Deadline(soon)
	defer done()
	if dl, ok := ctx.Deadline(); !ok || dl.After(callerDL) {
		t.Errorf("store calls end at %v, after the caller's deadline %v", dl, callerDL)
	}
}

// TestSharedDeadlineBounds asks for store-call contexts from several
// goroutines, across many of the shared deadlines, and checks each: its
// deadline leaves at least the timeout after the ask began, at most the
// timeout plus guard's step (timeout/8, at most 1 ms) after it returned;
// it keeps the caller's values; it is never done before its deadline, and
// it does end, with context.DeadlineExceeded. These are orderings of
// instants read around each call, so a loaded machine cannot break them.
func TestSharedDeadlineBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		timeout, step time.Duration
		parent        func() (context.Context, context.CancelFunc)
	}{
		{2 * time.Millisecond, 250 * time.Microsecond, func() (context.Context, context.CancelFunc) {
			return context.Background(), func() {}
		}},
		{20 * time.Millisecond, time.Millisecond, func() (context.Context, context.CancelFunc) {
			return context.Background(), func() {}
		}},
		// A caller's deadline later than the shared one leaves it in charge.
		{20 * time.Millisecond, time.Millisecond, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Hour)
		}},
	} {
		e := ruleset.New(memorystore.New(), enforce.WithTimeout(tc.timeout))
		base, cancel := tc.parent()
		defer cancel()
		parent := context.WithValue(base, ctxKey{}, "trace-1")
		var (
			wg                          sync.WaitGroup
			mu                          sync.Mutex
			n, short, long, early, lost int
			last                        context.Context
		)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
					t0 := time.Now()
					ctx, done := e.Deadline(parent)
					t1 := time.Now()
					dl, ok := ctx.Deadline()
					err := ctx.Err()
					t2 := time.Now()
					done()
					mu.Lock()
					n++
					if !ok || dl.Before(t0.Add(tc.timeout)) {
						short++
					}
					if dl.After(t1.Add(tc.timeout + tc.step)) {
						long++
					}
					if err != nil && t2.Before(dl) {
						early++
					}
					if ctx.Value(ctxKey{}) != "trace-1" {
						lost++
					}
					last = ctx
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if short+long+early+lost > 0 {
			t.Errorf("timeout %v: of %d contexts, %d had less than the timeout, %d more than timeout+step (%v), %d were done before their deadline, %d lost the caller's values",
				tc.timeout, n, short, long, tc.step, early, lost)
		}
		select {
		case <-last.Done():
		case <-time.After(10 * time.Second): // only a broken deadline gets here
			t.Fatalf("timeout %v: the deadline never fired", tc.timeout)
		}
		if got := last.Err(); !errors.Is(got, context.DeadlineExceeded) {
			t.Errorf("timeout %v: Err() = %v after Done, want DeadlineExceeded", tc.timeout, got)
		}
	}
}

// Failures are logged at most once per interval; the next record says how
// many were left out.
func TestFailureLogRateLimited(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	client := srv.Client(t)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	logs := &testkit.Logs{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := ruleset.New(redisstore.New(client), enforce.WithLogger(slog.New(logs)), enforce.WithLogInterval(10*time.Second),
		ruleset.WithClock(func() time.Time { return now }))
	r, err := e.Rule("api", enforce.FailOpen, false)
	if err != nil {
		t.Fatal(err)
	}
	policies := []enforce.Policy{{Name: "p", Limit: tollgate.PerSecond(1)}}
	for i := 0; i < 5; i++ {
		v, ds := r.Decide(context.Background(), "api:ip:192.0.2.1", policies, 1, nil)
		if v.Outcome != engine.FailedOpen || v.Err == nil || len(ds) != 0 {
			t.Fatalf("Redis down: %+v, %d decisions; want fail_open with the error", v, len(ds))
		}
	}
	now = now.Add(11 * time.Second)
	r.Decide(context.Background(), "api:ip:192.0.2.1", policies, 1, nil)
	recs := logs.Records()
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	var suppressed int64 = -1
	recs[1].Attrs(func(a slog.Attr) bool {
		if a.Key == "similar_events_not_logged" {
			suppressed = a.Value.Int64()
		}
		return true
	})
	if suppressed != 4 {
		t.Errorf("second record says %d suppressed, want 4", suppressed)
	}
}

func TestCheckPolicies(t *testing.T) {
	t.Parallel()
	ok := tollgate.PerSecond(1)
	for _, ps := range [][]enforce.Policy{
		nil,
		{{Name: "", Limit: ok}},
		{{Name: "a b", Limit: ok}},
		{{Name: "a", Limit: ok}, {Name: "a", Limit: tollgate.PerDay(1)}},
		{{Name: "a", Limit: ok}, {Name: "b", Limit: tollgate.PerSecond(9)}},
		{{Name: "a", Limit: tollgate.Limit{Rate: 1}}},
	} {
		if err := ruleset.CheckPolicies(ps); err == nil {
			t.Errorf("CheckPolicies(%+v) accepted it", ps)
		}
	}
	if err := ruleset.CheckPolicies([]enforce.Policy{{Name: "burst", Limit: ok}, {Name: "daily", Limit: tollgate.PerDay(1000)}}); err != nil {
		t.Errorf("a valid pair: %v", err)
	}
}

// TestRuleFailureMode: the zero value, FailDefault, fails open in an
// Engine; an unknown mode is refused.
func TestRuleFailureMode(t *testing.T) {
	t.Parallel()
	e := ruleset.New(memorystore.New())
	tests := []struct {
		in      enforce.FailureMode
		want    enforce.FailureMode
		wantErr bool
	}{
		{in: enforce.FailDefault, want: enforce.FailOpen},
		{in: enforce.FailOpen, want: enforce.FailOpen},
		{in: enforce.FailClosed, want: enforce.FailClosed},
		{in: enforce.FailClosed + 1, wantErr: true},
	}
	for _, tc := range tests {
		r, err := e.Rule("r", tc.in, false)
		if got, want := err != nil, tc.wantErr; got != want {
			t.Errorf("Rule(%v): error %v, want an error: %v", tc.in, err, want)
			continue
		}
		if err == nil {
			if got, want := r.FailureMode(), tc.want; got != want {
				t.Errorf("Rule(%v).FailureMode() = %v, want %v", tc.in, got, want)
			}
		}
	}
}

// TestOneTimeoutPerRequest: the store calls of one request share one
// deadline, and once it has passed the engine makes no further call: a
// request through two rules of two policies each, with Redis paused, costs
// one store timeout, not four, and every rule answers by its failure mode.
func TestOneTimeoutPerRequest(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	client := srv.Client(t)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	reg := prometheus.NewRegistry()
	key := ruleset.FuncKey("tenant", func(int) (string, bool) { return "t1", true })
	policies := []enforce.Policy{{Name: "second", Limit: tollgate.PerSecond(10)}, {Name: "day", Limit: tollgate.PerDay(1000)}}
	rules, err := ruleset.NewRules("test", "t", redisstore.New(client), key, []ruleset.Spec[int]{
		{Name: "a", Policies: policies}, {Name: "b", Policies: policies},
	}, ruleset.Resolve([]enforce.Option{enforce.WithTimeout(50 * time.Millisecond), enforce.WithRegistry(reg), enforce.WithLogger(slog.New(&testkit.Logs{}))}))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := rules.Decide(context.Background(), 0, nil, nil)
	if got, want := v.Outcome, engine.Allowed; got != want {
		t.Errorf("outcome %v, want %v (both rules fail open)", got, want)
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, want := range map[string]float64{
		"tollgate_t_store_errors_total,rule=a":                1,
		"tollgate_t_store_errors_total,rule=b":                0,
		"tollgate_t_store_duration_seconds,rule=a":            1,
		"tollgate_t_store_duration_seconds,rule=b":            0,
		"tollgate_t_decisions_total,outcome=fail_open,rule=a": 1,
		"tollgate_t_decisions_total,outcome=fail_open,rule=b": 1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}
