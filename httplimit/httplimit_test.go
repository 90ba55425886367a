package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
)

// Over real HTTP: headers on every response, then a 429 with Retry-After
// and a problem body naming the policy.
func TestHeadersAndDenial(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		c := newClock()
		limit := tollgate.Limit{Rate: 3, Period: time.Minute, Burst: 3}
		lim := mustNew(t, b.New(t, c.Now), []httplimit.Rule{{
			Name:     "api",
			Policies: []enforce.Policy{{Name: "per-minute", Limit: limit}},
		}}, enforce.WithHeaders(headers.Draft|headers.RateLimitFields|headers.XRateLimit), httplimit.WithClock(c.Now))
		srv := httptest.NewServer(lim.Handler(okHandler))
		defer srv.Close()

		for i := 1; i <= 4; i++ {
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			policy := parseSF(t, resp.Header, "RateLimit-Policy")
			if want := []sfItem{{"per-minute", map[string]any{"q": int64(3), "w": int64(60)}}}; !reflect.DeepEqual(policy, want) {
				t.Errorf("request %d: RateLimit-Policy = %+v, want %+v", i, policy, want)
			}
			rl := parseSF(t, resp.Header, "RateLimit")
			if i <= 3 {
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: status %d, want 200", i, resp.StatusCode)
				}
				// r counts down; t is when the bucket is full again: 20 s
				// per token spent.
				want := []sfItem{{"per-minute", map[string]any{"r": int64(3 - i), "t": int64(20 * i)}}}
				if !reflect.DeepEqual(rl, want) {
					t.Errorf("request %d: RateLimit = %+v, want %+v", i, rl, want)
				}
				if got := resp.Header.Get("Retry-After"); got != "" {
					t.Errorf("request %d: Retry-After %q on a 200", i, got)
				}
				resp.Body.Close()
				continue
			}
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("request 4: status %d, want 429", resp.StatusCode)
			}
			// The next token comes in 20 s: Retry-After, t and the older
			// fields all say so.
			for field, want := range map[string]string{
				"Retry-After":           "20",
				"RateLimit-Limit":       "3",
				"RateLimit-Remaining":   "0",
				"RateLimit-Reset":       "20",
				"X-RateLimit-Limit":     "3",
				"X-RateLimit-Remaining": "0",
				"X-RateLimit-Reset":     strconv.FormatInt(c.Now().Unix()+20, 10),
			} {
				if got := resp.Header.Get(field); got != want {
					t.Errorf("429: %s = %q, want %q", field, got, want)
				}
			}
			if got := rl[0].Params["t"]; got != int64(20) {
				t.Errorf("429: t = %v, want 20", got)
			}
			p := decodeProblem(t, resp)
			resp.Body.Close()
			want := problem{
				Type: quotaExceeded, Title: "Too Many Requests", Status: 429,
				ViolatedPolicies: []string{"per-minute"}, RetryAfter: 20,
			}
			p.Detail = ""
			if !reflect.DeepEqual(p, want) {
				t.Errorf("problem = %+v, want %+v", p, want)
			}
		}
		// 20 s later one request passes again.
		c.Advance(20 * time.Second)
		if w := do(lim.Handler(okHandler), "GET", "/", "127.0.0.1:1", nil); w.Code != http.StatusOK {
			t.Errorf("after 20 s: status %d, want 200", w.Code)
		}
	})
}

// Retry-After is rounded up: 1 ms short of a token still says 1, never 0.
func TestRetryAfterNeverZero(t *testing.T) {
	t.Parallel()
	c := newClock()
	lim := mustNew(t, memorystore.New(memorystore.WithClock(c.Now)), []httplimit.Rule{{
		Name: "api", Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerSecond(1)}},
	}})
	h := lim.Handler(okHandler)
	do(h, "GET", "/", "192.0.2.1:1", nil)
	c.Advance(999 * time.Millisecond)
	w := do(h, "GET", "/", "192.0.2.1:1", nil)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Errorf("1 ms before the token: status %d, Retry-After %q; want 429 and 1", w.Code, w.Header().Get("Retry-After"))
	}
}

// A spoofed X-Forwarded-For never changes the key: from an untrusted peer
// it is ignored; from a trusted proxy only the hops it vouches for count.
func TestSpoofing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		rules := []httplimit.Rule{{Name: "ip", Policies: []enforce.Policy{{Name: "ip", Limit: tollgate.PerMinute(2)}}}}
		get := func(t *testing.T, url, xff string) int {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("X-Forwarded-For", xff)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}

		t.Run("untrusted peer", func(t *testing.T) {
			// No trusted proxies: the loopback peer is the client, whatever
			// address each request claims.
			lim := mustNew(t, b.New(t, newClock().Now), rules)
			srv := httptest.NewServer(lim.Handler(okHandler))
			defer srv.Close()
			var got []int
			for i := 0; i < 3; i++ {
				got = append(got, get(t, srv.URL, "198.51.100."+strconv.Itoa(i)))
			}
			if want := []int{200, 200, 429}; !reflect.DeepEqual(got, want) {
				t.Errorf("statuses = %v, want %v", got, want)
			}
		})

		t.Run("trusted proxy", func(t *testing.T) {
			// The loopback peer is a trusted proxy: the client is the
			// address it appended; what the client wrote to its left is
			// ignored.
			lim := mustNew(t, b.New(t, newClock().Now), rules,
				enforce.WithClientIP(clientip.MustNew(clientip.TrustProxies("127.0.0.0/8"))))
			srv := httptest.NewServer(lim.Handler(okHandler))
			defer srv.Close()
			var got []int
			for i := 0; i < 3; i++ {
				got = append(got, get(t, srv.URL, "10.9.9."+strconv.Itoa(i)+", 203.0.113.7"))
			}
			got = append(got, get(t, srv.URL, "203.0.113.8")) // another client
			if want := []int{200, 200, 429, 200}; !reflect.DeepEqual(got, want) {
				t.Errorf("statuses = %v, want %v", got, want)
			}
		})
	})
}

func TestIPv6Grouping(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		lim := mustNew(t, b.New(t, newClock().Now), []httplimit.Rule{{
			Name: "ip", Policies: []enforce.Policy{{Name: "ip", Limit: tollgate.PerMinute(2)}},
		}})
		h := lim.Handler(okHandler)
		var got []int
		// Three addresses of one /64: one client, two requests a minute.
		for _, a := range []string{"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::3"} {
			got = append(got, do(h, "GET", "/", "["+a+"]:1", nil).Code)
		}
		// The next /64 is someone else.
		got = append(got, do(h, "GET", "/", "[2001:db8:1:3::1]:1", nil).Code)
		if want := []int{200, 200, 429, 200}; !reflect.DeepEqual(got, want) {
			t.Errorf("statuses = %v, want %v", got, want)
		}
	})
}

// Per-tenant plans: each tenant spends only its own quota, at its plan's
// rate, and two rules never share a counter.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		plans := map[string][]enforce.Policy{
			"free": {{Name: "free", Limit: tollgate.PerMinute(2)}},
			"pro":  {{Name: "pro", Limit: tollgate.PerMinute(4)}},
		}
		tenant := func(r *http.Request) (string, bool) {
			v := r.Header.Get("X-Tenant")
			return v, v != ""
		}
		lim := mustNew(t, b.New(t, newClock().Now), []httplimit.Rule{
			{
				Name:         "tenant",
				Pattern:      "/api/",
				Key:          httplimit.Func("tenant", tenant),
				PoliciesFunc: func(r *http.Request) []enforce.Policy { return plans[r.Header.Get("X-Plan")] },
			},
			// Same tenant values, another rule: its own counter.
			{Name: "export", Pattern: "POST /export", Key: httplimit.Func("tenant", tenant), Policies: []enforce.Policy{{Name: "export", Limit: tollgate.PerMinute(1)}}},
		})
		h := lim.Handler(okHandler)
		count := func(tenant, plan, method, path string, n int) (ok int) {
			for i := 0; i < n; i++ {
				if do(h, method, path, "192.0.2.1:1", http.Header{"X-Tenant": {tenant}, "X-Plan": {plan}}).Code == 200 {
					ok++
				}
			}
			return ok
		}
		if got := count("acme", "free", "GET", "/api/x", 5); got != 2 {
			t.Errorf("acme (free) got %d of 5 through, want 2", got)
		}
		// Same IP, another tenant: untouched by acme's traffic.
		if got := count("globex", "pro", "GET", "/api/x", 6); got != 4 {
			t.Errorf("globex (pro) got %d of 6 through, want 4", got)
		}
		// acme's exhausted /api/ quota does not touch its export quota.
		if got := count("acme", "free", "POST", "/export", 2); got != 1 {
			t.Errorf("acme export got %d of 2 through, want 1", got)
		}
		// No tenant: the tenant rules do not apply.
		if w := do(h, "GET", "/api/x", "192.0.2.1:1", nil); w.Code != 200 || w.Header().Get("RateLimit") != "" {
			t.Errorf("no tenant: status %d, RateLimit %q; want 200 and no header", w.Code, w.Header().Get("RateLimit"))
		}
	})
}

// Several policies: decided together, all or nothing. Every policy is
// reported, the tightest in the single-value fields, and a request denied
// by either spends neither.
func TestSeveralPolicies(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		c := newClock()
		lim := mustNew(t, b.New(t, c.Now), []httplimit.Rule{{
			Name: "api",
			Policies: []enforce.Policy{
				{Name: "burst", Limit: tollgate.PerSecond(2)},
				{Name: "hourly", Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: time.Hour}},
			},
		}}, enforce.WithHeaders(headers.Draft|headers.RateLimitFields))
		h := lim.Handler(okHandler)
		var codes []int
		var last *httptest.ResponseRecorder
		for i := 0; i < 4; i++ {
			last = do(h, "GET", "/", "192.0.2.1:1", nil)
			codes = append(codes, last.Code)
		}
		if want := []int{200, 200, 429, 429}; !reflect.DeepEqual(codes, want) {
			t.Fatalf("statuses = %v, want %v", codes, want)
		}
		// The burst denied; hourly is reported as it stands, unspent.
		if got := parseSF(t, last.Header(), "RateLimit"); len(got) != 2 || got[0].Name != "burst" || got[1].Name != "hourly" {
			t.Errorf("denied by burst: RateLimit = %+v, want burst and hourly", got)
		}
		if got := remaining(t, last.Header(), "hourly"); got != 3 {
			t.Errorf("denied by burst: hourly r = %d, want 3", got)
		}
		c.Advance(time.Second)
		w := do(h, "GET", "/", "192.0.2.1:1", nil)
		// Two denials spent nothing of the hourly quota: 5 - 3 = 2 left.
		if got := remaining(t, w.Header(), "hourly"); got != 2 {
			t.Errorf("hourly r = %d, want 2", got)
		}
		// The single-value fields report the tightest: burst, 1 left.
		if got := w.Header().Get("RateLimit-Remaining"); got != "1" {
			t.Errorf("RateLimit-Remaining = %q, want 1 (burst)", got)
		}
		c.Advance(time.Second)
		do(h, "GET", "/", "192.0.2.1:1", nil)
		w = do(h, "GET", "/", "192.0.2.1:1", nil) // hourly's last one
		if got := w.Header().Get("RateLimit-Limit"); w.Code != 200 || got != "5" {
			t.Errorf("status %d, RateLimit-Limit %q: want 200 and the hourly policy (5)", w.Code, got)
		}
		c.Advance(time.Second)
		w = do(h, "GET", "/", "192.0.2.1:1", nil)
		if w.Code != 429 || !strings.Contains(w.Body.String(), `"violated-policies":["hourly"]`) {
			t.Errorf("hourly exhausted: status %d, body %s", w.Code, w.Body)
		}
		// Denied by hourly, the burst spent nothing: still 2 of 2.
		for range 2 {
			if w = do(h, "GET", "/", "192.0.2.1:1", nil); w.Code != 429 || remaining(t, w.Header(), "burst") != 2 {
				t.Errorf("hourly exhausted: status %d, burst r = %d; want 429 and 2 (unspent)", w.Code, remaining(t, w.Header(), "burst"))
			}
		}
	})
}

func TestDryRun(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		reg := prometheus.NewRegistry()
		lim := mustNew(t, b.New(t, newClock().Now), []httplimit.Rule{{
			Name: "trial", DryRun: true, Policies: []enforce.Policy{{Name: "trial", Limit: tollgate.PerMinute(1)}},
		}}, enforce.WithRegistry(reg))
		h := lim.Handler(okHandler)
		do(h, "GET", "/", "192.0.2.1:1", nil)
		w := do(h, "GET", "/", "192.0.2.1:1", nil)
		if w.Code != http.StatusOK {
			t.Fatalf("dry run blocked: status %d", w.Code)
		}
		if got := w.Header().Get("Retry-After"); got != "" {
			t.Errorf("dry run set Retry-After %q", got)
		}
		rl := parseSF(t, w.Header(), "RateLimit")
		if len(rl) != 1 || rl[0].Params["tollgate-dry-run"] != true || rl[0].Params["r"] != int64(0) {
			t.Errorf("RateLimit = %+v, want r=0 marked tollgate-dry-run", rl)
		}
		for outcome, want := range map[string]float64{"allowed": 1, "dry_run_denied": 1, "denied": 0} {
			if got := testutil.ToFloat64(decisions(t, reg, "trial", outcome)); got != want {
				t.Errorf("decisions{outcome=%s} = %v, want %v", outcome, got, want)
			}
		}
	})
}

// decisions returns the decisions counter of rule and outcome from reg.
func decisions(t *testing.T, reg *prometheus.Registry, rule, outcome string) prometheus.Collector {
	t.Helper()
	return gaugeFrom(t, reg, "tollgate_http_decisions_total", map[string]string{"rule": rule, "outcome": outcome})
}

// gaugeFrom finds one series in reg and returns it as a constant collector
// for testutil.ToFloat64.
func gaugeFrom(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			v := m.GetCounter().GetValue()
			if m.GetHistogram() != nil {
				v = float64(m.GetHistogram().GetSampleCount())
			}
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 { return v })
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return nil
}

// A shaping leaky bucket delays instead of rejecting: each request waits
// its turn, up to MaxDelay; past that it is rejected.
func TestShaping(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		c := newClock()
		shaper := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 1, MaxDelay: 300 * time.Millisecond}
		lim := mustNew(t, b.New(t, c.Now), []httplimit.Rule{{
			Name: "webhooks", Policies: []enforce.Policy{{Name: "drain", Limit: shaper}},
		}})
		var mu sync.Mutex
		var waited []time.Duration
		httplimit.SetWait(lim, func(_ context.Context, d time.Duration) error {
			mu.Lock()
			waited = append(waited, d)
			mu.Unlock()
			return nil
		})
		h := lim.Handler(okHandler)
		var codes []int
		for i := 0; i < 5; i++ {
			codes = append(codes, do(h, "POST", "/hook", "192.0.2.1:1", nil).Code)
		}
		if want := []int{200, 200, 200, 200, 429}; !reflect.DeepEqual(codes, want) {
			t.Errorf("statuses = %v, want %v", codes, want)
		}
		if want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}; !reflect.DeepEqual(waited, want) {
			t.Errorf("waited %v, want %v", waited, want)
		}
	})
}

// The real wait: the handler runs only after the delay, and a request whose
// context ends first is answered 503 instead of waiting in vain.
func TestShapingWaitsForReal(t *testing.T) {
	t.Parallel()
	shaper := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 20, Period: time.Second, Burst: 1, MaxDelay: time.Second}
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{{
		Name: "shape", Policies: []enforce.Policy{{Name: "drain", Limit: shaper}},
	}})
	h := lim.Handler(okHandler)
	do(h, "GET", "/", "192.0.2.1:1", nil)
	start := time.Now()
	w := do(h, "GET", "/", "192.0.2.1:1", nil) // 50 ms behind the first
	if w.Code != 200 {
		t.Fatalf("status %d, want 200", w.Code)
	}
	if elapsed := time.Since(start); elapsed < 40*time.Millisecond {
		t.Errorf("shaped request answered after %v, before its delay of about 50ms", elapsed)
	}

	// A request whose deadline comes before its turn is answered at once.
	// Its own limiter drains one a second, so its turn is about a second
	// away, and its deadline, 300 ms, leaves the store call most of that:
	// neither a pause of the machine before it (the queue drains) nor one
	// during it (the store's deadline passes) can let it through.
	slow := mustNew(t, memorystore.New(), []httplimit.Rule{{
		Name: "shape", Policies: []enforce.Policy{{Name: "drain", Limit: tollgate.Limit{
			Algorithm: tollgate.LeakyBucket, Rate: 1, Period: time.Second, Burst: 1, MaxDelay: 10 * time.Second,
		}}},
	}}).Handler(okHandler)
	do(slow, "GET", "/", "192.0.2.1:1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, "GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	rec := httptest.NewRecorder()
	slow.ServeHTTP(rec, r) // would have to wait about a second
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("deadline before the delay: status %d, Retry-After %q, RateLimit %q; want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit"))
	}
}

// Works as middleware around a Go 1.22 ServeMux; patterns pick requests,
// the Route key separates resources, and rules without a match cost nothing.
func TestServeMuxAndPatterns(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("user " + r.PathValue("id"))) })
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("welcome")) })
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{
		{Name: "login", Pattern: "POST /login", FailureMode: enforce.FailClosed, Policies: []enforce.Policy{{Name: "login", Limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 1, Period: time.Minute}}}},
		{Name: "users", Pattern: "GET /users/{id}", Key: httplimit.Route(), Policies: []enforce.Policy{{Name: "per-user", Limit: tollgate.PerMinute(1)}}},
	})
	h := lim.Handler(mux)
	for _, tc := range []struct {
		method, path string
		want         int
		body         string
	}{
		{"POST", "/login", 200, "welcome"},
		{"POST", "/login", 429, ""},
		{"GET", "/login", 405, ""}, // not the rule's method: the mux answers
		{"GET", "/users/1", 200, "user 1"},
		{"GET", "/users/1", 429, ""},
		{"HEAD", "/users/1", 200, ""}, // GET patterns match HEAD, as in ServeMux; the route key differs
		{"GET", "/users/2", 200, "user 2"},
		{"GET", "/users/2/x", 404, ""},
	} {
		w := do(h, tc.method, tc.path, "192.0.2.1:1", nil)
		if w.Code != tc.want || (tc.body != "" && w.Body.String() != tc.body) {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, w.Code, w.Body, tc.want, tc.body)
		}
	}
}

func TestCostAndLongKeys(t *testing.T) {
	t.Parallel()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{{
		Name: "bytes",
		Key:  httplimit.Header("X-API-Key"),
		Cost: func(r *http.Request) int {
			n, _ := strconv.Atoi(r.Header.Get("X-Units"))
			return n
		},
		Policies: []enforce.Policy{{Name: "units", Limit: tollgate.Limit{Rate: 10, Period: time.Minute, Burst: 10}}},
	}})
	h := lim.Handler(okHandler)
	huge := strings.Repeat("k", 4000) // longer than any store key: hashed, still limited
	for _, tc := range []struct {
		key, units string
		want       int
	}{
		{huge, "6", 200},
		{huge, "6", 429},
		{huge, "4", 200},
		{"other", "11", 413}, // can never pass: no Retry-After
		{"other", "0", 200},  // costs nothing: not counted
		{"", "5", 200},       // no API key: the rule does not apply
	} {
		w := do(h, "GET", "/", "192.0.2.1:1", http.Header{"X-Api-Key": {tc.key}, "X-Units": {tc.units}})
		if w.Code != tc.want {
			t.Errorf("key %.8q cost %s: status %d, want %d", tc.key, tc.units, w.Code, tc.want)
		}
		if w.Code == 413 && w.Header().Get("Retry-After") != "" {
			t.Errorf("413 with Retry-After %q: retrying cannot help", w.Header().Get("Retry-After"))
		}
	}
}

func TestRejectHandler(t *testing.T) {
	t.Parallel()
	var got httplimit.Rejection
	c := newClock()
	lim := mustNew(t, memorystore.New(memorystore.WithClock(c.Now)), []httplimit.Rule{{
		Name: "api", Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(1)}},
	}}, httplimit.WithRejectHandler(func(w http.ResponseWriter, r *http.Request, rej httplimit.Rejection) {
		got = rej
		w.WriteHeader(rej.Status)
		_, _ = w.Write([]byte("slow down"))
	}))
	h := lim.Handler(okHandler)
	do(h, "GET", "/", "192.0.2.1:1", nil)
	w := do(h, "GET", "/", "192.0.2.1:1", nil)
	if w.Code != 429 || w.Body.String() != "slow down" || w.Header().Get("Retry-After") != "60" {
		t.Errorf("custom rejection: %d %q Retry-After %q", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	if got.Rule != "api" || got.Policy != "p" || got.Status != 429 || got.RetryAfter != time.Minute {
		t.Errorf("Rejection = %+v", got)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	ok := []enforce.Policy{{Name: "p", Limit: tollgate.PerSecond(1)}}
	for _, tc := range []struct {
		name  string
		rules []httplimit.Rule
	}{
		{"no name", []httplimit.Rule{{Policies: ok}}},
		{"colon in name", []httplimit.Rule{{Name: "a:b", Policies: ok}}},
		{"duplicate rule", []httplimit.Rule{{Name: "a", Policies: ok}, {Name: "a", Policies: ok}}},
		{"no policies", []httplimit.Rule{{Name: "a"}}},
		{"invalid limit", []httplimit.Rule{{Name: "a", Policies: []enforce.Policy{{Name: "p", Limit: tollgate.Limit{Rate: 1}}}}}},
		{"shared counter", []httplimit.Rule{{Name: "a", Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerSecond(1)}, {Name: "q", Limit: tollgate.PerSecond(5)}}}}},
		{"both policy sources", []httplimit.Rule{{Name: "a", Policies: ok, PoliciesFunc: func(*http.Request) []enforce.Policy { return ok }}}},
		{"bad pattern", []httplimit.Rule{{Name: "a", Pattern: "GET users", Policies: ok}}},
		{"bad key kind", []httplimit.Rule{{Name: "a", Key: httplimit.Func("a:b", nil), Policies: ok}}},
		{"one-part composite", []httplimit.Rule{{Name: "a", Key: httplimit.Composite(httplimit.ClientIP()), Policies: ok}}},
	} {
		if _, err := httplimit.New(memorystore.New(), tc.rules); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
	if _, err := httplimit.New(nil, nil); err == nil {
		t.Error("New accepted a nil store")
	}
}

// Metrics go to the registry passed, never the global one.
func TestMetricsRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{{
		Name: "api", Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(1)}},
	}}, enforce.WithRegistry(reg))
	h := lim.Handler(okHandler)
	do(h, "GET", "/", "192.0.2.1:1", nil)
	do(h, "GET", "/", "192.0.2.1:1", nil)
	if got := testutil.ToFloat64(decisions(t, reg, "api", "denied")); got != 1 {
		t.Errorf("denied = %v, want 1", got)
	}
	if got := testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_store_duration_seconds", map[string]string{"rule": "api"})); got != 2 {
		t.Errorf("store latency samples = %v, want 2", got)
	}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "tollgate_") {
			t.Errorf("%s registered globally", mf.GetName())
		}
	}
	// A second Limiter on the same registry must share metrics, not clash.
	if _, err := httplimit.New(memorystore.New(), nil, enforce.WithRegistry(reg)); err == nil {
		t.Error("a second registration on one registry did not fail")
	}
	var already prometheus.AlreadyRegisteredError
	_, err = httplimit.New(memorystore.New(), nil, enforce.WithRegistry(reg))
	if !errors.As(err, &already) {
		t.Errorf("error %v does not wrap AlreadyRegisteredError", err)
	}
}
