package httplimit_test

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// TestPenalty: 2 logins a second; the third denial within a minute keeps
// the client out for the penalty, past the second in which the limit
// refills, with a Retry-After to its end; then it is let in again. On
// memory with a clock the test moves, and on Redis in real time with a
// short penalty.
func TestPenalty(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		store   func(t *testing.T, now func() time.Time) tollgate.Store
		penalty time.Duration
		wait    func(c *testkit.Clock, d time.Duration)
	}{
		{"memory", func(t *testing.T, now func() time.Time) tollgate.Store {
			return memorystore.New(memorystore.WithClock(now))
		},
			10 * time.Minute, func(c *testkit.Clock, d time.Duration) { c.Advance(d) }},
		{"redis", func(t *testing.T, _ func() time.Time) tollgate.Store { return redisstore.New(server.Client(t)) },
			3 * time.Second, func(_ *testkit.Clock, d time.Duration) { time.Sleep(d) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			reg := prometheus.NewRegistry()
			lim := mustNew(t, tc.store(t, c.Now), []httplimit.Rule{{
				Name: "login",
				Policies: []enforce.Policy{{Name: "tries", Limit: tollgate.PerSecond(2),
					Penalty: &enforce.Penalty{For: tc.penalty, After: 3, Within: time.Minute}}},
			}}, enforce.WithRegistry(reg))
			h := lim.Handler(okHandler)
			var codes []int
			var retry []string
			for range 5 {
				w := do(h, "POST", "/login", "192.0.2.9:1", nil)
				codes, retry = append(codes, w.Code), append(retry, w.Header().Get("Retry-After"))
			}
			// Two in, two denials of the limit's own, the third starts the
			// penalty: its Retry-After is the penalty's.
			want := []int{200, 200, 429, 429, 429}
			if !reflect.DeepEqual(codes, want) {
				t.Fatalf("statuses %v, want %v", codes, want)
			}
			if got, want := retry[4], strconv.Itoa(int(tc.penalty/time.Second)); got != want {
				t.Errorf("Retry-After of the tripping denial %q, want %q (retries %q)", got, want, retry)
			}
			if retry[3] != "1" {
				t.Errorf("Retry-After before the penalty %q, want 1 (the limit's own)", retry[3])
			}
			penalties := testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_penalties_total", map[string]string{"rule": "login", "policy": "tries"}))
			if penalties != 1 {
				t.Errorf("penalties_total = %v, want 1", penalties)
			}

			tc.wait(c, 1500*time.Millisecond) // the limit has refilled; the penalty runs on
			if w := do(h, "POST", "/login", "192.0.2.9:1", nil); w.Code != 429 {
				t.Errorf("during the penalty: %d, want 429", w.Code)
			} else if got, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || got < 1 || time.Duration(got)*time.Second > tc.penalty {
				t.Errorf("during the penalty: Retry-After %q, want the penalty's remainder, at most %v", w.Header().Get("Retry-After"), tc.penalty)
			}
			if w := do(h, "POST", "/login", "192.0.2.10:1", nil); w.Code != 200 {
				t.Errorf("another client during the penalty: %d, want 200", w.Code)
			}

			tc.wait(c, tc.penalty)
			if w := do(h, "POST", "/login", "192.0.2.9:1", nil); w.Code != 200 {
				t.Errorf("after the penalty: %d, want 200", w.Code)
			}
		})
	}
}
