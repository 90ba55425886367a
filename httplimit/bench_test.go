package httplimit_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
)

// benchWriter is a ResponseWriter that keeps its header map between
// requests, as a handler that sets any header of its own would have one.
type benchWriter struct{ h http.Header }

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *benchWriter) WriteHeader(int)             {}

// BenchmarkMiddleware compares one request through the middleware with the
// store call it makes, on memorystore, over 10,000 client addresses. The
// difference is what the middleware adds: matching, the namespaced key, the
// deadline, the decision bookkeeping and the headers.
//
//	go test -run '^$' -bench Middleware -benchmem -count 3 -benchtime 300000x ./httplimit/
func BenchmarkMiddleware(b *testing.B) {
	const nkeys = 10_000
	limit := tollgate.Limit{Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000}
	reqs := make([]*http.Request, nkeys)
	keys := make([]string, nkeys)
	for i := range reqs {
		ip := "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
		reqs[i] = &http.Request{Method: "GET", URL: mustURL("/api/items"), RemoteAddr: ip + ":40000", Header: http.Header{}}
		reqs[i] = reqs[i].WithContext(context.Background())
		keys[i] = "api:ip:" + ip
	}
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

	// The baseline: a handler that makes the same store call with a key
	// built beforehand, and nothing else, in the same loop.
	b.Run("store-only", func(b *testing.B) {
		store := memorystore.New()
		var i int
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := store.AllowN(r.Context(), keys[i%nkeys], limit, 1); err != nil {
				b.Fatal(err)
			}
		})
		w := &benchWriter{h: http.Header{"Content-Type": {"application/json"}}}
		b.ReportAllocs()
		for i = 0; b.Loop(); i++ {
			clear(w.h)
			h.ServeHTTP(w, reqs[i%nkeys])
		}
	})
	for _, tc := range []struct {
		name string
		opts []enforce.Option
	}{
		{"middleware", nil},
		{"middleware-no-deadline", []enforce.Option{enforce.WithTimeout(0)}},
		{"middleware-all-flavors", []enforce.Option{enforce.WithHeaders(headers.Draft | headers.RateLimitFields | headers.XRateLimit)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			lim, err := httplimit.New(memorystore.New(), []httplimit.Rule{{
				Name:     "api",
				Pattern:  "/api/",
				Policies: []enforce.Policy{{Name: "api", Limit: limit}},
			}}, tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			h := lim.Handler(noop)
			w := &benchWriter{h: http.Header{"Content-Type": {"application/json"}}}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				clear(w.h)
				h.ServeHTTP(w, reqs[i%nkeys])
			}
			if w.h.Get("RateLimit") == "" {
				b.Fatal("no RateLimit header")
			}
		})
	}
}

func mustURL(path string) *url.URL {
	u, err := url.Parse(path)
	if err != nil {
		panic(err)
	}
	return u
}
