// Command llm is a token-metered, LLM-style completion endpoint behind
// tollgate's middleware, as several replicas would run it on one Redis:
//
//   - per tenant, a budget of tokens per minute (-tokens, -per): each request reserves an
//     estimate before the model runs, and settles the real count the model
//     reports once it is done (a failed generation is refunded);
//   - per tenant, at most a few generations running at once, whatever
//     their size: the concurrency limit protects the GPUs from what is
//     already running, the token rate from what a tenant starts.
//
// The model is a fake: it streams one word per token, sleeping between
// them, and reports the tokens it produced in the X-Tokens-Used trailer.
//
//	go run ./examples/llm -redis redis://127.0.0.1:6379 -addr 127.0.0.1:8081
//	curl -N -H 'X-Tenant: acme' -d '' 'localhost:8081/v1/completions?tokens=40'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/redisstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is what the flags set.
type config struct {
	addr, redisURL string
	tokens         int
	per            time.Duration
	estimate       int
	concurrent     int
	tokenDelay     time.Duration
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("llm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8081", "listen address (port 0: any free port)")
	fs.StringVar(&c.redisURL, "redis", "redis://127.0.0.1:6379", "Redis URL shared by every replica")
	fs.IntVar(&c.tokens, "tokens", 1000, "tokens per tenant per -per")
	fs.DurationVar(&c.per, "per", time.Minute, "the period of the token budget")
	fs.IntVar(&c.estimate, "estimate", 200, "tokens reserved for a request whose max_tokens is not given")
	fs.IntVar(&c.concurrent, "concurrent", 2, "generations running at once per tenant")
	fs.DurationVar(&c.tokenDelay, "token-delay", 10*time.Millisecond, "time the fake model takes per token")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if c.tokenDelay <= 0 {
		fmt.Fprintln(stderr, "llm: -token-delay must be positive")
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	opt, err := redis.ParseURL(c.redisURL)
	if err != nil {
		fmt.Fprintln(stderr, "llm:", err)
		return 2
	}
	opt.ContextTimeoutEnabled = true // the middleware's deadline bounds each call
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	reg := prometheus.NewRegistry()
	handler, lim, err := newHandler(redisstore.New(rdb, redisstore.WithPrefix("llm:")), c, reg, logger)
	if err != nil {
		fmt.Fprintln(stderr, "llm:", err)
		return 2
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		fmt.Fprintln(stderr, "llm:", err)
		return 1
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	select {
	case err := <-errc:
		fmt.Fprintln(stderr, "llm:", err)
		return 1
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "llm:", err)
		return 1
	}
	// The last responses' settles: without them their estimates stand.
	if err := lim.Drain(shutdown); err != nil {
		fmt.Fprintln(stderr, "llm: settles left undone:", err)
		return 1
	}
	return 0
}

// newHandler puts the completion endpoint behind the token budget and the
// concurrency limit, both kept in store, and serves the metrics on
// /metrics.
func newHandler(store *redisstore.Store, c config, reg *prometheus.Registry, logger *slog.Logger) (http.Handler, *httplimit.Limiter, error) {
	tenant := func(r *http.Request) (string, bool) {
		t := r.Header.Get("X-Tenant") // your authenticated tenant
		return t, t != ""
	}
	lim, err := httplimit.New(store, []httplimit.Rule{{
		Name:    "tokens",
		Pattern: "POST /v1/completions",
		Key:     httplimit.Func("tenant", tenant),
		Policies: []enforce.Policy{{Name: "tokens", Limit: tollgate.Limit{
			Algorithm: tollgate.TokenBucket, Rate: c.tokens, Period: c.per, Burst: c.tokens,
		}}},
		// The estimate: what the client allows the model to produce, or
		// the default. A request that cannot afford it waits for tokens.
		Cost: func(r *http.Request) int {
			if n, err := strconv.Atoi(r.URL.Query().Get("max_tokens")); err == nil && n > 0 {
				return n
			}
			return c.estimate
		},
		// The real count, from the model: a refund of what it did not
		// produce, a charge for what it produced beyond the estimate, and
		// all of it back when the model failed, or when the concurrency
		// limit behind this rule turned the request away (429).
		Settle: &httplimit.Settle{Header: "X-Tokens-Used", Refund: func(status int) bool {
			return status == http.StatusTooManyRequests || httplimit.ServerError(status)
		}},
	}}, enforce.WithRegistry(reg), enforce.WithLogger(logger), enforce.WithTimeout(200*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	conc, err := httplimit.Concurrency(store, httplimit.ConcurrencyRule{
		Name:    "generations",
		Pattern: "POST /v1/completions",
		Key:     tenant,
		Max:     c.concurrent,
	}, enforce.WithLogger(logger), enforce.WithTimeout(200*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/completions", generator{tokenDelay: c.tokenDelay})
	root := http.NewServeMux()
	root.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // not limited
	root.Handle("/", lim.Handler(conc.Handler(mux)))                              // the rate first: it rejects without a slot
	return root, lim, nil
}

// generator is the fake model: ?tokens=N words (default 50), one every
// tokenDelay (or ?delay=, a duration), streamed as they come, stopping
// early when the client goes away; ?fail answers 500 without generating. The tokens produced are
// reported in the X-Tokens-Used trailer, which is what the limiter
// settles.
type generator struct{ tokenDelay time.Duration }

func (g generator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Has("fail") {
		http.Error(w, "the model is overloaded", http.StatusInternalServerError)
		return
	}
	want, err := strconv.Atoi(q.Get("tokens"))
	if err != nil || want < 0 {
		want = 50
	}
	w.Header().Set("Trailer", "X-Tokens-Used")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rc := http.NewResponseController(w)
	used := 0
	defer func() { w.Header().Set("X-Tokens-Used", strconv.Itoa(used)) }()
	delay := g.tokenDelay
	if d, err := time.ParseDuration(q.Get("delay")); err == nil && d > 0 {
		delay = d
	}
	t := time.NewTicker(delay)
	defer t.Stop()
	for used < want {
		select {
		case <-r.Context().Done():
			return // the client left: what was produced is still billed
		case <-t.C:
		}
		if _, err := fmt.Fprintf(w, "tok%d ", used); err != nil {
			return
		}
		used++
		_ = rc.Flush()
	}
	_, _ = io.WriteString(w, "\n")
}
