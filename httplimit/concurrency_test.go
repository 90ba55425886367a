package httplimit_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// mustConcurrency makes concurrency middleware whose store deadline is
// generous (see mustNew) unless opts set one.
func mustConcurrency(t *testing.T, store tollgate.ConcurrencyStore, rule httplimit.ConcurrencyRule, opts ...enforce.Option) func(http.Handler) http.Handler {
	t.Helper()
	opts = append([]enforce.Option{enforce.WithTimeout(10 * time.Second)}, opts...)
	mw, err := httplimit.Concurrency(store, rule, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw.Handler
}

// byTenant keys requests by X-Tenant; a request without one is not limited.
func byTenant(r *http.Request) (string, bool) {
	v := r.Header.Get("X-Tenant")
	return v, v != ""
}

var tenantAcme = http.Header{"X-Tenant": {"acme"}}

// permits returns how many permits Redis holds for key under st: live or
// lapsed, every permit not released.
func permits(t *testing.T, st *redisstore.Store, key string) int64 {
	t.Helper()
	n, err := server.Client(t).ZCard(context.Background(), st.ConcurrencyKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Two replicas, each its own middleware over its own redisstore.Store on
// one Redis, share one limit of 3 per tenant. First 10 clients whose
// handlers block: 3 run, 7 get 429 with Retry-After and a problem body.
// Then many clients with short random handlers: never more than 3 run at
// once. Afterwards the key holds no permit.
func TestConcurrencyTwoReplicas(t *testing.T) {
	t.Parallel()
	const max = 3
	prefix := testkit.KeyPrefix(t)
	var flight testkit.InFlight
	gate := make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // a failed test does not leave its clients blocked
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		flight.Enter()
		defer flight.Leave()
		if r.Header.Get("X-Block") != "" {
			<-gate
		} else {
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		}
	})
	rule := httplimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: max}
	var stores []*redisstore.Store
	var replicas []http.Handler
	for range 2 {
		st := redisstore.New(server.Client(t), redisstore.WithPrefix(prefix))
		stores = append(stores, st)
		replicas = append(replicas, mustConcurrency(t, st, rule)(handler))
	}

	const blocked = 10
	codes := make(chan *httptest.ResponseRecorder, blocked)
	var wg sync.WaitGroup
	for i := range blocked {
		wg.Go(func() {
			codes <- do(replicas[i%2], "GET", "/export", "192.0.2.1:1", http.Header{"X-Tenant": {"acme"}, "X-Block": {"1"}})
		})
	}
	testkit.Eventually(t, "every blocked client running or answered", func() bool { return flight.Now()+int64(len(codes)) == blocked })
	if got, want := flight.Now(), int64(max); got != want {
		t.Fatalf("%d blocked clients running at once across the replicas, want %d", got, want)
	}
	for range blocked - max {
		w := <-codes
		if got, want := w.Code, http.StatusTooManyRequests; got != want {
			t.Errorf("a client over the limit: status %d, want %d", got, want)
			continue
		}
		if s, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || s < 1 {
			t.Errorf("Retry-After %q, want whole seconds ≥ 1", w.Header().Get("Retry-After"))
		}
		p := decodeProblem(t, w.Result())
		if p.Type != quotaExceeded || p.Status != 429 || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "export" {
			t.Errorf("429 problem = %+v", p)
		}
	}
	if got, want := permits(t, stores[0], "export:acme"), int64(max); got != want {
		t.Errorf("while 3 run: %d permits in Redis, want %d", got, want)
	}
	open()
	wg.Wait()
	for range max {
		if w := <-codes; w.Code != http.StatusOK {
			t.Errorf("an admitted client: status %d, want 200", w.Code)
		}
	}
	if got, want := permits(t, stores[1], "export:acme"), int64(0); got != want {
		t.Errorf("after the blocked round: %d permits left, want %d", got, want)
	}

	flight.ResetPeak() // this round's own peak
	var ok, denied, other atomic.Int64
	for c := range 16 {
		wg.Go(func() {
			for i := range 25 {
				switch do(replicas[(c+i)%2], "GET", "/export", "192.0.2.1:1", tenantAcme).Code {
				case http.StatusOK:
					ok.Add(1)
				case http.StatusTooManyRequests:
					denied.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("random round: %d served, %d denied; peak in flight %d of %d", ok.Load(), denied.Load(), flight.Peak(), max)
	if got := flight.Peak(); got > max {
		t.Errorf("%d requests in flight at once, max %d", got, max)
	}
	if ok.Load() == 0 || other.Load() != 0 {
		t.Errorf("random round: %d served, %d with another status than 200 or 429", ok.Load(), other.Load())
	}
	if got, want := permits(t, stores[0], "export:acme"), int64(0); got != want {
		t.Errorf("after the random round: %d permits left, want %d", got, want)
	}
}

// A handler that panics still gives its slot back, and the panic goes on
// up to the server.
func TestConcurrencyPanicReleases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		value any // what the handler panics with; nil: it returns
	}{
		{"returns", nil},
		{"panics", "boom"},
		{"aborts", http.ErrAbortHandler},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := redisstore.New(server.Client(t), redisstore.WithPrefix(testkit.KeyPrefix(t)))
			h := mustConcurrency(t, st, httplimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: 1})(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if tc.value != nil && r.Header.Get("X-Panic") != "" {
						panic(tc.value)
					}
				}))
			got := func() (v any) {
				defer func() { v = recover() }()
				do(h, "GET", "/", "192.0.2.1:1", http.Header{"X-Tenant": {"acme"}, "X-Panic": {"1"}})
				return nil
			}()
			if got != tc.value {
				t.Errorf("recovered %v, want %v", got, tc.value)
			}
			if got, want := permits(t, st, "export:acme"), int64(0); got != want {
				t.Errorf("%d permits after the handler, want %d", got, want)
			}
			if got, want := do(h, "GET", "/", "192.0.2.1:1", tenantAcme).Code, http.StatusOK; got != want {
				t.Errorf("the next request: %d, want %d", got, want)
			}
		})
	}
}

// A handler that runs three half-leases keeps its slot past the end of its
// first lease: another request is still denied. When it ends the renewals
// stop and the slot is free.
func TestConcurrencyLeaseRenewed(t *testing.T) {
	t.Parallel()
	const lease = time.Second // renewals every 500 ms: late only on a machine stalled that long
	st := &testkit.RenewCounter{ConcurrencyStore: redisstore.New(server.Client(t), redisstore.WithPrefix(testkit.KeyPrefix(t)))}
	mw := mustConcurrency(t, st, httplimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: 1, Lease: lease})
	var second *httptest.ResponseRecorder
	var h http.Handler
	h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		testkit.Eventually(t, "3 renewals", func() bool { return st.Renewals.Load() >= 3 })
		if elapsed := time.Since(start); elapsed < lease {
			t.Errorf("3 renewals after %v, before the first lease ended", elapsed)
		}
		second = do(h, "GET", "/", "192.0.2.1:1", tenantAcme)
	}))
	if got, want := do(h, "GET", "/", "192.0.2.1:1", tenantAcme).Code, http.StatusOK; got != want {
		t.Fatalf("the long request: %d, want %d", got, want)
	}
	if got, want := second.Code, http.StatusTooManyRequests; got != want {
		t.Errorf("a request while the long one runs past its first lease: %d, want %d", got, want)
	}
	n := st.Renewals.Load()
	if got := st.Failures.Load(); got != 0 {
		t.Errorf("%d of %d renewals failed", got, n)
	}
	if got, want := permits(t, st.ConcurrencyStore.(*redisstore.Store), "export:acme"), int64(0); got != want {
		t.Errorf("%d permits after the request, want %d", got, want)
	}
	time.Sleep(2 * lease) // would hold 4 renewals if they went on
	if got := st.Renewals.Load(); got != n {
		t.Errorf("%d renewals after the request ended, want none", got-n)
	}
}

// With Redis stopped, a fail-open rule runs the handler without a slot and
// a fail-closed rule answers 503 with Retry-After; each logs one record
// for three failures.
func TestConcurrencyRedisStopped(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	st := redisstore.New(srv.Client(t))
	handlers := map[enforce.FailureMode]http.Handler{}
	logs := &testkit.Logs{}
	for _, mode := range []enforce.FailureMode{enforce.FailOpen, enforce.FailClosed} {
		handlers[mode] = mustConcurrency(t, st, httplimit.ConcurrencyRule{Name: "export-" + mode.String(), Key: byTenant, Max: 1, FailureMode: mode},
			enforce.WithTimeout(time.Second), enforce.WithLogger(slog.New(logs)), enforce.WithLogInterval(time.Hour))(okHandler)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode       enforce.FailureMode
		code       int
		retryAfter string
		body       string
	}{
		{enforce.FailOpen, http.StatusOK, "", "ok"},
		{enforce.FailClosed, http.StatusServiceUnavailable, "1", ""},
	} {
		for range 3 {
			w := do(handlers[tc.mode], "GET", "/", "192.0.2.1:1", tenantAcme)
			if got, want := w.Code, tc.code; got != want {
				t.Errorf("%v with Redis down: status %d, want %d", tc.mode, got, want)
			}
			if got, want := w.Header().Get("Retry-After"), tc.retryAfter; got != want {
				t.Errorf("%v with Redis down: Retry-After %q, want %q", tc.mode, got, want)
			}
			if tc.body != "" && w.Body.String() != tc.body {
				t.Errorf("%v with Redis down: body %q, want %q", tc.mode, w.Body, tc.body)
			}
			if w.Code == http.StatusServiceUnavailable {
				if p := decodeProblem(t, w.Result()); p.Type != reducedCap || p.Status != 503 {
					t.Errorf("503 problem = %+v", p)
				}
			}
		}
	}
	recs := logs.Attrs()
	got := map[string]string{}
	for _, r := range recs {
		got[r["rule"]] = r["call"] + " " + r["outcome"]
	}
	want := map[string]string{"export-fail_open": "acquire fail_open", "export-fail_closed": "acquire fail_closed"}
	if len(recs) != 2 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("log records %v, want one per rule: %v", recs, want)
	}
}

// Redis stops while a request holds a slot: its renewals fail and are
// logged, the request still completes, and the failed release is logged.
func TestConcurrencyRenewalFails(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	st := redisstore.New(srv.Client(t))
	logs := &testkit.Logs{}
	calls := func() string {
		var s []string
		for _, r := range logs.Attrs() {
			s = append(s, r["call"])
		}
		return strings.Join(s, ",")
	}
	h := mustConcurrency(t, st, httplimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: 1, Lease: 200 * time.Millisecond},
		enforce.WithTimeout(time.Second), enforce.WithLogger(slog.New(logs)), enforce.WithLogInterval(time.Hour))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := srv.Stop(); err != nil {
				t.Error(err)
			}
			testkit.Eventually(t, "a failed renewal logged", func() bool { return calls() != "" })
			_, _ = w.Write([]byte("done"))
		}))
	w := do(h, "GET", "/", "192.0.2.1:1", tenantAcme)
	if got, want := w.Code, http.StatusOK; got != want || w.Body.String() != "done" {
		t.Errorf("request whose renewals failed: %d %q, want %d \"done\"", got, w.Body, want)
	}
	if got, want := calls(), "renew,release"; got != want {
		t.Errorf("logged failures of %q, want %q", got, want)
	}
}

// The rule applies only to the requests it matches and keys; each key has
// its own slots. A handler holding the only slot of tenant acme makes a
// second request from inside, which tells what the rule does with it.
func TestConcurrencyApplies(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 2*tollgate.MaxKeyLen)
	for _, tc := range []struct {
		name   string
		outer  string // the tenant of the request holding the slot; "": acme
		method string
		target string
		header http.Header
		want   int
	}{
		{"same key", "", "POST", "/exports", tenantAcme, http.StatusTooManyRequests},
		// Too long for a store key: hashed, not failed open.
		{"same long key", long, "POST", "/exports", http.Header{"X-Tenant": {long}}, http.StatusTooManyRequests},
		{"other long key", long, "POST", "/exports", http.Header{"X-Tenant": {long + "y"}}, http.StatusOK},
		{"other key", "", "POST", "/exports", http.Header{"X-Tenant": {"globex"}}, http.StatusOK},
		{"no key", "", "POST", "/exports", nil, http.StatusOK},
		{"other method", "", "GET", "/exports", tenantAcme, http.StatusOK},
		{"other path", "", "POST", "/imports", tenantAcme, http.StatusOK},
		{"not matched", "", "POST", "/exports", http.Header{"X-Tenant": {"acme"}, "X-Internal": {"1"}}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var inner int
			var h http.Handler
			mw := mustConcurrency(t, memorystore.New(), httplimit.ConcurrencyRule{
				Name: "export", Pattern: "POST /exports", Key: byTenant, Max: 1,
				Match: func(r *http.Request) bool { return r.Header.Get("X-Internal") == "" },
			})
			h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Outer") != "" {
					inner = do(h, tc.method, tc.target, "192.0.2.1:1", tc.header).Code
				}
			}))
			outer := cmp.Or(tc.outer, "acme")
			if got := do(h, "POST", "/exports", "192.0.2.1:1", http.Header{"X-Tenant": {outer}, "X-Outer": {"1"}}).Code; got != http.StatusOK {
				t.Fatalf("outer request: %d", got)
			}
			if got, want := inner, tc.want; got != want {
				t.Errorf("inner request: %d, want %d", got, want)
			}
		})
	}
}

func TestConcurrencyInvalidRule(t *testing.T) {
	t.Parallel()
	ok := httplimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: 5}
	for _, tc := range []struct {
		name   string
		store  tollgate.ConcurrencyStore
		edit   func(*httplimit.ConcurrencyRule)
		target error // nil: any error
	}{
		{"nil store", nil, func(*httplimit.ConcurrencyRule) {}, nil},
		{"no name", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Name = "" }, nil},
		{"colon in name", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Name = "a:b" }, nil},
		{"no key", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Key = nil }, nil},
		{"max 0", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Max = 0 }, tollgate.ErrInvalidLimit},
		{"max too big", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Max = tollgate.MaxConcurrency + 1 }, tollgate.ErrInvalidLimit},
		{"lease too short", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Lease = time.Microsecond }, tollgate.ErrInvalidLimit},
		{"lease too long", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Lease = 25 * time.Hour }, tollgate.ErrInvalidLimit},
		{"bad pattern", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.Pattern = "POST exports" }, nil},
		{"bad failure mode", memorystore.New(), func(r *httplimit.ConcurrencyRule) { r.FailureMode = 9 }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rule := ok
			tc.edit(&rule)
			mw, err := httplimit.Concurrency(tc.store, rule)
			if err == nil || mw != nil {
				t.Fatalf("Concurrency(%+v) = %v, %v; want an error", rule, mw != nil, err)
			}
			if !strings.HasPrefix(err.Error(), "httplimit: ") {
				t.Errorf("error %q does not start with the package name", err)
			}
			if tc.target != nil && !errors.Is(err, tc.target) {
				t.Errorf("error %q is not %v", err, tc.target)
			}
		})
	}
}

// A custom rejection handler sees the concurrency decision, with
// Retry-After already set.
func TestConcurrencyRejectHandler(t *testing.T) {
	t.Parallel()
	var got httplimit.Rejection
	var retryAfter string
	mw := mustConcurrency(t, memorystore.New(), httplimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: 1, Lease: 90 * time.Second},
		httplimit.WithRejectHandler(func(w http.ResponseWriter, r *http.Request, rej httplimit.Rejection) {
			got, retryAfter = rej, w.Header().Get("Retry-After")
			w.WriteHeader(rej.Status)
		}))
	var h http.Handler
	outer := true
	h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if outer {
			outer = false
			do(h, "GET", "/", "192.0.2.1:1", tenantAcme)
		}
	}))
	do(h, "GET", "/", "192.0.2.1:1", tenantAcme)
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"Status", got.Status, http.StatusTooManyRequests},
		{"Rule", got.Rule, "export"},
		{"Policy", got.Policy, "export"},
		{"Concurrency.Allowed", got.Concurrency.Allowed, false},
		{"Concurrency.Max", got.Concurrency.Max, 1},
		{"Concurrency.Remaining", got.Concurrency.Remaining, 0},
		// The earliest lease's end, in whole seconds rounded up.
		{"Retry-After", retryAfter, strconv.FormatInt(int64((got.RetryAfter+time.Second-1)/time.Second), 10)},
		{"Err", got.Err, nil},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if got.RetryAfter <= 0 || got.RetryAfter > 90*time.Second {
		t.Errorf("RetryAfter = %v, want within the 90 s lease", got.RetryAfter)
	}
}
