// Command nethttp is a plain net/http service limited by tollgate's
// middleware: a per-IP limit on /api/, per-API-key plans, a strict
// fail-closed limit on /login, a dry-run rule being tried out, and the
// metrics on /metrics.
//
//	go run ./examples/nethttp -addr 127.0.0.1:8080                         # memory store
//	go run ./examples/nethttp -redis redis://127.0.0.1:6379 -trust 127.0.0.1 # shared by replicas, behind a local proxy
//
// Then: curl -i localhost:8080/api/items
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// plans maps API keys to their plan's limits (your accounts database):
// a rate and a daily quota each, decided together, so a request the rate
// turns away does not spend the quota.
var plans = map[string][]enforce.Policy{
	"free-key": {
		{Name: "free-minute", Limit: tollgate.PerMinute(5)},
		{Name: "free-day", Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 100, Period: 24 * time.Hour}},
	},
	"pro-key": {
		{Name: "pro-minute", Limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 600, Period: time.Minute}},
		{Name: "pro-day", Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 100_000, Period: 24 * time.Hour}},
	},
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("nethttp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	redisURL := fs.String("redis", "", "Redis URL (redis://host:port); empty: in-process memory store")
	trust := fs.String("trust", "", "comma-separated CIDRs of proxies whose X-Forwarded-For is trusted")
	flavor := fs.String("headers", "draft,x-ratelimit", "header flavours: draft, ratelimit, x-ratelimit, all")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))

	store, err := newStore(*redisURL)
	if err != nil {
		fmt.Fprintln(stderr, "nethttp:", err)
		return 2
	}
	reg := prometheus.NewRegistry()
	lim, err := newLimiter(store, *trust, *flavor, reg, logger)
	if err != nil {
		fmt.Fprintln(stderr, "nethttp:", err)
		return 2
	}

	srv := &http.Server{Addr: *addr, Handler: routes(lim, reg), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	logger.Info("listening", "addr", *addr, "redis", *redisURL != "", "trusted proxies", *trust)
	select {
	case err := <-errc:
		fmt.Fprintln(stderr, "nethttp:", err)
		return 1
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "nethttp:", err)
		return 1
	}
	return 0
}

// newStore returns the Redis store of redisURL, shared by every replica,
// or an in-process memory store when redisURL is empty.
func newStore(redisURL string) (tollgate.Store, error) {
	if redisURL == "" {
		return memorystore.New(), nil
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, err
	}
	opt.ContextTimeoutEnabled = true // let the middleware's deadline bound each call
	return redisstore.New(redis.NewClient(opt)), nil
}

// newLimiter is the middleware: rules over store, believing the
// X-Forwarded-For of the proxies in trust, answering with the header
// fields of flavor, its metrics in reg.
func newLimiter(store tollgate.Store, trust, flavor string, reg *prometheus.Registry, logger *slog.Logger) (*httplimit.Limiter, error) {
	var ipOpts []clientip.Option
	if trust != "" {
		ipOpts = append(ipOpts, clientip.TrustProxies(strings.Split(trust, ",")...))
	}
	ips, err := clientip.New(ipOpts...)
	if err != nil {
		return nil, err
	}
	fl, err := headers.ParseFlavor(flavor)
	if err != nil {
		return nil, err
	}
	return httplimit.New(store, rules(), enforce.WithClientIP(ips), enforce.WithHeaders(fl), enforce.WithRegistry(reg), enforce.WithLogger(logger))
}

// rules are the service's limits. Unlike ServeMux's patterns, every rule
// that matches a request applies, not only the most specific.
func rules() []httplimit.Rule {
	return []httplimit.Rule{
		{
			// Everyone, by IP: 10 per second with bursts of 20, 1000 a day.
			Name:    "api-ip",
			Pattern: "/api/",
			Policies: []enforce.Policy{
				{Name: "burst", Limit: tollgate.Limit{Rate: 10, Period: time.Second, Burst: 20}},
				{Name: "daily", Limit: tollgate.PerDay(1000)},
			},
		},
		{
			// Callers with an API key: their plan's limit.
			Name:    "api-key",
			Pattern: "/api/",
			Key:     httplimit.Header("X-API-Key"),
			PoliciesFunc: func(r *http.Request) []enforce.Policy {
				return plans[r.Header.Get("X-API-Key")]
			},
		},
		{
			// Login: exact, and closed when the limiter cannot decide.
			Name:        "login",
			Pattern:     "POST /login",
			FailureMode: enforce.FailClosed,
			Policies:    []enforce.Policy{{Name: "login", Limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 3, Period: time.Minute}}},
		},
		{
			// A stricter limit being tried out: reported, never enforced.
			Name:     "api-next",
			Pattern:  "/api/",
			DryRun:   true,
			Policies: []enforce.Policy{{Name: "next", Limit: tollgate.PerMinute(30)}},
		},
	}
}

// routes is the service: its API behind lim, and the metrics in reg,
// which are not limited.
func routes(lim *httplimit.Limiter, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/items", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `[{"id":1},{"id":2}]`)
	})
	mux.HandleFunc("GET /api/items/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "{\"id\":%q}\n", r.PathValue("id"))
	})
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "welcome") })
	root := http.NewServeMux()
	root.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // not limited
	root.Handle("/", lim.Handler(mux))
	return root
}
