package service

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/service/config"
)

// Option configures a Server.
type Option func(*Server)

// WithTimeout sets the deadline of each request's store calls together
// (default enforce.DefaultTimeout, 50 ms, as for the middleware). When it passes, each rule's failure mode decides.
// Requests starting within a millisecond of each other share one timer, so
// a request may get up to a millisecond more. A caller's own deadline that
// comes sooner (Envoy's filter sends 20 ms by default) bounds the store
// calls instead, less a reserve for the answer's way back (half the time
// the caller has left, at most 10 ms), so that a slow store is
// answered by failure mode while the caller still waits. 0 sets no
// deadline at all, for a store that never waits (memorystore).
func WithTimeout(d time.Duration) Option { return func(s *Server) { s.timeout = d } }

// WithFailureMode sets what rules without their own failure_mode answer
// when the store fails: enforce.FailOpen (the default) or
// enforce.FailClosed (config.FailureMode is the same type).
func WithFailureMode(m enforce.FailureMode) Option { return func(s *Server) { s.failMode = m } }

// DefaultFailClosedRetryAfter is when a client turned away because a rule
// failed closed is told to come back unless WithFailClosedRetryAfter says
// otherwise: a second, as the middleware tells it
// (enforce.WithFailClosedRetryAfter).
const DefaultFailClosedRetryAfter = time.Second

// WithFailClosedRetryAfter sets when a client turned away because a rule
// failed closed (its store failed or missed the deadline) should come back
// (default DefaultFailClosedRetryAfter): the Retry-After of the answer,
// unless a denial of the same request waits longer, and the
// duration_until_reset of the descriptor. No store said when the limit
// frees up, so this is a guess at when the store is back: keep it short. d
// ≤ 0 keeps the default.
func WithFailClosedRetryAfter(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.failRetry = d
		}
	}
}

// WithDryRun makes the whole service a dry run, as envoyproxy/ratelimit's
// global SHADOW_MODE does: every decision is made and counted, but the
// overall answer is always OK, so that limits can be watched before they
// are enforced.
func WithDryRun(on bool) Option { return func(s *Server) { s.dryRun = on } }

// WithLogInterval logs store failures at most once per d (default
// enforce.DefaultLogInterval, 10 s, as for the middleware); each record
// says how many were left out since the previous one, in its
// similar_events_not_logged attribute. 0 logs every failure.
func WithLogInterval(d time.Duration) Option { return func(s *Server) { s.logEvery = d } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithRegistry sets the Prometheus registry the server registers its
// metrics on and serves at /metrics. By default it makes its own, with the
// Go runtime and process collectors.
func WithRegistry(r *prometheus.Registry) Option { return func(s *Server) { s.reg = r } }

// WithPing sets how the server checks that its store answers (for
// /readyz): for Redis, a PING. Without it the store is taken to be always
// reachable, which is right for memorystore.
func WithPing(ping func(context.Context) error) Option { return func(s *Server) { s.ping = ping } }

// WithHeaders selects the rate-limit header fields put in
// response_headers_to_add (and on /json and the auth endpoint's
// responses): by default headers.Draft, the IETF RateLimit-Policy and
// RateLimit fields; 0 adds none. Retry-After comes with every flavour when
// the request is over the limit.
func WithHeaders(f headers.Flavor) Option { return func(s *Server) { s.hdr.flavor = f } }

// WithLoadOptions sets how Reload loads rules (config.WithMergeDomains,
// config.WithRuntimeTree, config.WithLimits, …): pass the options the
// first load used, or a reload would read the files differently.
func WithLoadOptions(opts ...config.Option) Option {
	return func(s *Server) { s.loadOpts = append(s.loadOpts, opts...) }
}

// WithParallelDescriptors makes the store calls of a request's
// descriptors at once rather than one after another, so that a request of
// several descriptors waits for one round trip to a remote store (with
// redisstore.WithPipeline, they go in one pipeline). Each descriptor still
// spends on its own. It costs a goroutine per descriptor: for Redis, not
// for memorystore, whose calls never wait.
func WithParallelDescriptors(on bool) Option { return func(s *Server) { s.parallel = on } }

// WithClock sets the server's clock (default time.Now); tests use it.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithConcurrencyStore sets the store of the rules' concurrency limits
// (config.Concurrency): redisstore.Store for a limit shared by every
// replica, memorystore.Store for one process. Without it a
// concurrency rule cannot decide and answers by its failure mode.
func WithConcurrencyStore(cs tollgate.ConcurrencyStore) Option {
	return func(s *Server) { s.conc = cs }
}
