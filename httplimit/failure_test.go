package httplimit_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/redisstore"
)

// failureLimiter limits /open (fail-open) and /closed (fail-closed) on a
// Redis server of the test's own, so that the test can stop it.
func failureLimiter(t *testing.T, srv *redistest.Server, opts ...enforce.Option) (http.Handler, *prometheus.Registry, *testkit.Logs) {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &testkit.Logs{}
	limit := []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(100)}}
	opts = append([]enforce.Option{
		// Long enough for a first call on a busy machine, short enough that
		// the calls made while Redis is down give up before go-redis has
		// retried its dials for seconds.
		enforce.WithTimeout(time.Second),
		enforce.WithRegistry(reg),
		enforce.WithLogger(slog.New(logs)),
		enforce.WithLogInterval(time.Hour), // one record, then counted
	}, opts...)
	lim := mustNew(t, redisstore.New(srv.Client(t)), []httplimit.Rule{
		{Name: "open", Pattern: "/open", FailureMode: enforce.FailOpen, Policies: limit},
		{Name: "closed", Pattern: "/closed", FailureMode: enforce.FailClosed, Policies: limit},
	}, opts...)
	return lim.Handler(okHandler), reg, logs
}

// The Redis process is killed mid-test: fail-open rules let requests
// through, fail-closed rules answer 503 with Retry-After; both are counted
// and logged, the log rate-limited; when Redis is back, limits are back.
func TestRedisStopped(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	h, reg, logs := failureLimiter(t, srv)

	for _, path := range []string{"/open", "/closed"} {
		if w := do(h, "GET", path, "192.0.2.1:1", nil); w.Code != 200 || w.Header().Get("RateLimit") == "" {
			t.Fatalf("%s with Redis up: %d, RateLimit %q", path, w.Code, w.Header().Get("RateLimit"))
		}
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		w := do(h, "GET", "/open", "192.0.2.1:1", nil)
		if w.Code != 200 || w.Body.String() != "ok" {
			t.Errorf("/open with Redis down: %d %q, want 200 from the handler", w.Code, w.Body)
		}
		if got := w.Header().Get("RateLimit"); got != "" {
			t.Errorf("/open with Redis down: RateLimit %q reports a decision nobody made", got)
		}
		w = do(h, "GET", "/closed", "192.0.2.1:1", nil)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
			t.Errorf("/closed with Redis down: %d, Retry-After %q; want 503 and 1", w.Code, w.Header().Get("Retry-After"))
		}
		if w.Code == http.StatusServiceUnavailable {
			p := decodeProblem(t, w.Result())
			if p.Type != reducedCap || p.Status != 503 {
				t.Errorf("503 problem = %+v", p)
			}
		}
	}
	for _, tc := range []struct {
		rule, outcome string
		want          float64
	}{
		{"open", "fail_open", 3}, {"closed", "fail_closed", 3},
		{"open", "allowed", 1}, {"closed", "allowed", 1},
	} {
		if got := testutil.ToFloat64(decisions(t, reg, tc.rule, tc.outcome)); got != tc.want {
			t.Errorf("decisions{rule=%s,outcome=%s} = %v, want %v", tc.rule, tc.outcome, got, tc.want)
		}
	}
	for _, rule := range []string{"open", "closed"} {
		if got := testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_store_errors_total", map[string]string{"rule": rule})); got != 3 {
			t.Errorf("store_errors{rule=%s} = %v, want 3", rule, got)
		}
	}
	// Six failures, one log record: an outage does not flood the log.
	recs := logs.Attrs()
	if len(recs) != 1 {
		t.Fatalf("%d log records for 6 failures, want 1: %v", len(recs), recs)
	}
	if recs[0]["rule"] != "open" || recs[0]["outcome"] != "fail_open" || recs[0]["error"] == "" {
		t.Errorf("log record = %v", recs[0])
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// go-redis backs off dialing after failed dials, so the first requests
	// after the restart may still fail (and are handled as above); within a
	// few seconds the limits are back, counted afresh by the empty server.
	for _, path := range []string{"/open", "/closed"} {
		var w *httptest.ResponseRecorder
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if w = do(h, "GET", path, "192.0.2.1:1", nil); w.Header().Get("RateLimit") != "" {
				break
			}
		}
		if w.Code != 200 || w.Header().Get("RateLimit") == "" || remaining(t, w.Header(), "p") != 99 {
			t.Errorf("%s after Redis restarted (empty): %d, RateLimit %q; want 200 and r=99", path, w.Code, w.Header().Get("RateLimit"))
		}
	}
}

// Redis hangs (SIGSTOP): the store call's deadline ends the wait, and the
// failure mode applies; the request returns instead of hanging.
func TestRedisPaused(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	h, reg, logs := failureLimiter(t, srv, enforce.WithTimeout(100*time.Millisecond), enforce.WithLogInterval(0))
	if w := do(h, "GET", "/open", "192.0.2.1:1", nil); w.Code != 200 {
		t.Fatalf("Redis up: %d", w.Code)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })

	done := make(chan [2]int, 1)
	go func() {
		done <- [2]int{
			do(h, "GET", "/open", "192.0.2.1:1", nil).Code,
			do(h, "GET", "/closed", "192.0.2.1:1", nil).Code,
		}
	}()
	select {
	case codes := <-done:
		if codes != [2]int{200, 503} {
			t.Errorf("with Redis paused: /open %d, /closed %d; want 200 and 503", codes[0], codes[1])
		}
	case <-time.After(30 * time.Second): // only a hang gets here
		t.Fatal("requests did not return while Redis was paused")
	}
	for _, rule := range []string{"open", "closed"} {
		if got := testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_store_errors_total", map[string]string{"rule": rule})); got != 1 {
			t.Errorf("store_errors{rule=%s} = %v, want 1", rule, got)
		}
	}
	if recs := logs.Attrs(); len(recs) != 2 {
		t.Errorf("%d log records with WithLogInterval(0), want 2", len(recs))
	} else {
		t.Logf("logged: %s", recs[0]["error"])
	}
}
