package ruleset

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
)

// settings are what the options set: the engine's, and those every
// transport built on Rules reads.
type settings struct {
	timeout        time.Duration
	metrics        *Metrics
	registry       prometheus.Registerer
	logger         *slog.Logger
	logEvery       time.Duration
	now            func() time.Time
	ips            *clientip.Resolver
	flavor         headers.Flavor
	failRetryAfter time.Duration
}

func newSettings(opts []Option) settings {
	s := settings{
		timeout: enforce.DefaultTimeout, logEvery: enforce.DefaultLogInterval, now: time.Now,
		ips: &clientip.Resolver{}, flavor: headers.Draft, failRetryAfter: time.Second,
	}
	for _, o := range opts {
		o(&s)
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	return s
}

// Option configures Rules and the transports built on them (httplimit,
// grpclimit), which all take the same options.
type Option func(*settings)

// WithTimeout bounds the store calls of each request, all its rules
// together, with a deadline of d (DefaultTimeout: 50 ms), or the caller's
// own deadline less a reserve for the answer when that comes sooner (see
// Engine), so that a slow or hung store cannot hold the request; past it
// each rule's failure mode applies, without further store calls. To save a timer per
// request, requests starting within d/8 (at most 1 ms) of each other share
// one deadline: each gets between d and d + min(d/8, 1 ms). 0 removes the
// deadline: only for a store that never waits, such as memorystore.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithRegistry registers the metrics of a transport built on Rules
// (tollgate_<subsystem>_decisions_total, …_store_duration_seconds,
// …_store_errors_total; see Metrics) on reg.
func WithRegistry(reg prometheus.Registerer) Option { return func(s *settings) { s.registry = reg } }

// WithLogger logs store failures to l (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *settings) { s.logger = l } }

// WithLogInterval logs store failures at most once per d (default
// DefaultLogInterval); each record says how many were left out since the
// previous one, in its similar_events_not_logged attribute. 0 logs every
// failure.
func WithLogInterval(d time.Duration) Option { return func(s *settings) { s.logEvery = d } }

// WithClock sets the clock (default time.Now) that paces failure logs and
// that X-RateLimit-Reset is computed from. Store decisions use the store's
// own clock.
func WithClock(now func() time.Time) Option { return func(s *settings) { s.now = now } }

// WithClientIP finds client addresses with r: set it to trust your
// proxies' forwarding headers (gRPC: the same names as metadata keys,
// lower-cased). Without it the client is the peer address.
func WithClientIP(r *clientip.Resolver) Option { return func(s *settings) { s.ips = r } }

// WithHeaders selects the header flavours a transport sends with every
// response (default headers.Draft: RateLimit-Policy and RateLimit).
// Retry-After is sent on every rejection whatever the flavour.
func WithHeaders(f headers.Flavor) Option { return func(s *settings) { s.flavor = f } }

// WithFailClosedRetryAfter sets when a request rejected by a fail-closed
// rule whose store failed should be retried (default 1 s): HTTP's
// Retry-After on the 503, gRPC's RetryInfo on the UNAVAILABLE.
func WithFailClosedRetryAfter(d time.Duration) Option {
	return func(s *settings) { s.failRetryAfter = d }
}

func newEngine(store tollgate.Store, s settings) *engine.Engine {
	return engine.NewEngine(store, s.timeout, s.logger, s.logEvery, s.now)
}
