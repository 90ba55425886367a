package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
)

// A per-IP limit on an API behind a load balancer in 10.0.0.0/8: clients
// are told how much is left on every response, and get a 429 with
// Retry-After past the limit. With redisstore.New(rdb) instead of the
// memory store, every replica shares the limit.
func Example_perIPBehindProxy() {
	lim, err := httplimit.New(memorystore.New(), []httplimit.Rule{{
		Name:    "api",
		Pattern: "/api/",
		Policies: []enforce.Policy{
			{Name: "burst", Limit: tollgate.PerSecond(2)},
			{Name: "daily", Limit: tollgate.PerDay(10_000)},
		},
	}}, enforce.WithClientIP(clientip.MustNew(clientip.TrustProxies("10.0.0.0/8"))))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/items", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "items") })
	handler := lim.Handler(mux)

	for i := 0; i < 3; i++ {
		r := httptest.NewRequest("GET", "/api/items", nil)
		r.RemoteAddr = "10.0.0.9:40000"                         // the load balancer
		r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.7") // spoofed, then the real client
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "burst";r=1;t=1, "daily";r=9999;t=9 Retry-After: ""
	// 200 RateLimit: "burst";r=0;t=1, "daily";r=9998;t=18 Retry-After: ""
	// 429 RateLimit: "burst";r=0;t=1, "daily";r=9998;t=18 Retry-After: "1"
}

// Per-API-key plans: the key's plan picks its limits; each key spends only
// its own quota.
func Example_perAPIKeyPlans() {
	plans := map[string][]enforce.Policy{
		"free": {{Name: "free", Limit: tollgate.PerMinute(1)}},
		"pro":  {{Name: "pro", Limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 1000, Period: time.Minute}}},
	}
	planOf := map[string]string{"key-a": "free", "key-b": "pro"} // your accounts database
	lim, err := httplimit.New(memorystore.New(), []httplimit.Rule{{
		Name: "plans",
		Key:  httplimit.Header("X-API-Key"),
		PoliciesFunc: func(r *http.Request) []enforce.Policy {
			return plans[planOf[r.Header.Get("X-API-Key")]] // none: the rule does not apply
		},
	}})
	if err != nil {
		panic(err)
	}
	handler := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, key := range []string{"key-a", "key-a", "key-b", "key-b"} {
		r := httptest.NewRequest("GET", "/report", nil)
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Println(key, w.Code, w.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// key-a 200 "free";q=1;w=60
	// key-a 429 "free";q=1;w=60
	// key-b 200 "pro";q=1000;w=60
	// key-b 200 "pro";q=1000;w=60
}

// At most one export in flight per tenant. While acme's export runs, a
// second one from acme is turned away with 429 and Retry-After (when the
// running one's lease ends at the latest), and globex's runs. With
// redisstore.New(rdb) instead of the memory store, the limit holds across
// every replica.
func ExampleConcurrency() {
	export, err := httplimit.Concurrency(memorystore.New(), httplimit.ConcurrencyRule{
		Name:    "export",
		Pattern: "POST /exports",
		Key: func(r *http.Request) (string, bool) {
			t := r.Header.Get("X-Tenant") // your authenticated tenant
			return t, t != ""
		},
		Max: 1,
	})
	if err != nil {
		panic(err)
	}
	post := func(h http.Handler, tenant string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/exports", nil)
		r.Header.Set("X-Tenant", tenant)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	var handler http.Handler
	long := true
	handler = export.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if long { // the first export runs long: others arrive meanwhile
			long = false
			for _, tenant := range []string{"acme", "globex"} {
				w := post(handler, tenant)
				fmt.Printf("meanwhile %s: %d Retry-After: %q\n", tenant, w.Code, w.Header().Get("Retry-After"))
			}
		}
		fmt.Fprintln(w, "exported")
	}))
	fmt.Println("acme:", post(handler, "acme").Code)
	fmt.Println("acme again:", post(handler, "acme").Code)
	// Output:
	// meanwhile acme: 429 Retry-After: "30"
	// meanwhile globex: 200 Retry-After: ""
	// acme: 200
	// acme again: 200
}

// An endpoint billed in LLM tokens: each request reserves an estimate of
// 500 of its tenant's 10,000 tokens a minute before the model runs, and is
// settled to the count the handler reports in the X-Tokens-Used trailer,
// which clients do not see; a 5xx is refunded. The RateLimit header
// describes the reservation; the next request sees the settled count:
// 10,000 − 120 used − its own 500 reserved.
func ExampleSettle() {
	lim, err := httplimit.New(memorystore.New(), []httplimit.Rule{{
		Name:     "completions",
		Pattern:  "POST /v1/completions",
		Key:      httplimit.Header("X-Tenant"),
		Policies: []enforce.Policy{{Name: "tokens", Limit: tollgate.PerMinute(10_000)}},
		Cost:     func(*http.Request) int { return 500 },
		Settle:   &httplimit.Settle{Header: "X-Tokens-Used", Hide: true, Refund: httplimit.ServerError},
	}})
	if err != nil {
		panic(err)
	}
	model := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("fail") {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Trailer", "X-Tokens-Used")
		fmt.Fprintln(w, "Once upon a time…")
		w.Header().Set("X-Tokens-Used", "120") // counted by the model
	})
	handler := lim.Handler(model)

	for _, target := range []string{"/v1/completions", "/v1/completions?fail", "/v1/completions"} {
		r := httptest.NewRequest("POST", target, nil)
		r.Header.Set("X-Tenant", "acme")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s X-Tokens-Used: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("X-Tokens-Used"))
		_ = lim.Drain(r.Context()) // the settle runs after the response
	}
	// Output:
	// 200 RateLimit: "tokens";r=9500;t=3 X-Tokens-Used: ""
	// 503 RateLimit: "tokens";r=9380;t=4 X-Tokens-Used: ""
	// 200 RateLimit: "tokens";r=9380;t=4 X-Tokens-Used: ""
}
