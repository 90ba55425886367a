package httplimit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
)

// TestAllocsPerRequest pins the heap allocations of one admitted request
// through the middleware, for a key the store already holds, to what they
// are at most: one, the request's frame (the context of its store calls,
// its header fields and their text), when the store is memorystore, which
// is lent its keys (internal/store/lentkeys); two, the frame and the store
// key, with any other store. A count is not a time: it is the same on a
// loaded machine. Not parallel: the count is the whole process's.
func TestAllocsPerRequest(t *testing.T) {
	limit := tollgate.Limit{Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000}
	far, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, tc := range []struct {
		name  string
		store tollgate.Store
		opts  []enforce.Option
		ctx   context.Context
		want  float64
	}{
		{"default options", memorystore.New(), nil, context.Background(), 1},
		{"caller's deadline after the shared one", memorystore.New(), nil, far, 1},
		{"no deadline", memorystore.New(), []enforce.Option{enforce.WithTimeout(0)}, context.Background(), 1},
		{"every header flavour", memorystore.New(), []enforce.Option{enforce.WithHeaders(headers.Draft | headers.RateLimitFields | headers.XRateLimit)}, context.Background(), 1},
		{"metrics, the request timed", memorystore.New(), []enforce.Option{enforce.WithRegistry(prometheus.NewRegistry())}, context.Background(), 1},
		{"a store not lent its keys", struct{ tollgate.Store }{memorystore.New()}, nil, context.Background(), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := httplimit.New(tc.store, []httplimit.Rule{{
				Name:     "api",
				Pattern:  "/api/",
				Policies: []enforce.Policy{{Name: "api", Limit: limit}},
			}}, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := (&http.Request{Method: "GET", URL: mustURL("/api/items"), RemoteAddr: "192.0.2.1:40000", Header: http.Header{}}).WithContext(tc.ctx)
			w := &benchWriter{h: http.Header{"Content-Type": {"application/json"}}}
			got := testing.AllocsPerRun(1000, func() {
				clear(w.h)
				h.ServeHTTP(w, r)
			})
			if w.h.Get("RateLimit") == "" {
				t.Fatal("no RateLimit header: the request did not go through the rule")
			}
			if got > tc.want {
				t.Errorf("%v allocations per request, want at most %v", got, tc.want)
			}
		})
	}
}
