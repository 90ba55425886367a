package enforce

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/settings"
)

// Option configures a door: httplimit.New and httplimit.Concurrency,
// grpclimit.New and grpclimit.Concurrency all take the same Options, so
// one list of them configures a service's HTTP and gRPC limits alike. A
// door may add options of its own (httplimit.WithRejectHandler).
type Option func(*settings.Door)

// WithTimeout bounds the store calls of each request's rules, together,
// with a deadline of d (default DefaultTimeout, 50 ms), or the request's
// own deadline less a reserve for the answer when that comes sooner, so
// that a slow or hung Redis cannot hold requests; past it each rule's
// failure mode applies, without further store calls. Requests starting
// within d/8 (at most 1 ms) of each other share one timer: each gets
// between d and d + min(d/8, 1 ms). 0 removes the deadline: only for a
// store that never waits, such as memorystore.
func WithTimeout(d time.Duration) Option { return func(s *settings.Door) { s.Timeout = d } }

// WithClientIP finds client addresses with r: set it to trust your
// proxies' forwarding headers (gRPC reads the same names as metadata keys,
// lower-cased: "x-forwarded-for"). Without it the client is the peer
// address.
func WithClientIP(r *clientip.Resolver) Option { return func(s *settings.Door) { s.ClientIP = r } }

// WithHeaders selects the header flavours sent with every response (gRPC:
// as response metadata), default headers.Draft: RateLimit-Policy and
// RateLimit. Retry-After (gRPC: RetryInfo) comes with every rejection
// whatever the flavour.
func WithHeaders(f headers.Flavor) Option { return func(s *settings.Door) { s.Flavor = f } }

// WithRegistry registers the door's metrics on reg:
//
//	tollgate_<door>_decisions_total{rule, outcome}       counter
//	tollgate_<door>_store_duration_seconds{rule}         histogram
//	tollgate_<door>_store_errors_total{rule}             counter
//	tollgate_<door>_bad_costs_total{rule}                counter
//	tollgate_<door>_request_duration_seconds{decision}   histogram
//
// where <door> is http or grpc, and outcome one of allowed, denied,
// dry_run_denied, fail_open and fail_closed, so the throttle ratio of a
// rule is its denied / all. The store's latency and errors include the
// settles of rules that settle, made after the response; bad_costs_total
// counts the real costs responses reported that could not be used.
// request_duration_seconds times each request (gRPC: each unary call) from
// the middleware to its handler's return, or to its rejection, by
// decision: admitted (the handler ran at once), delayed (after a shaping
// delay) or denied (turned away before the handler), so that the latency
// of throttled traffic, which often rises first, is seen apart from the
// rest. Without it nothing
// is recorded, and never on the global registry unless passed. Two limiters
// of one door on one registry clash: wrap it for each, as
// prometheus.WrapRegistererWith(prometheus.Labels{"limiter": name}, reg).
func WithRegistry(reg prometheus.Registerer) Option {
	return func(s *settings.Door) { s.Registry = reg }
}

// WithLogger logs store failures to l (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *settings.Door) { s.Logger = l } }

// WithLogInterval logs store failures at most once per d (default
// DefaultLogInterval, 10 s); each record says how many were left out since
// the previous one, in its similar_events_not_logged attribute. 0 logs
// every failure.
func WithLogInterval(d time.Duration) Option { return func(s *settings.Door) { s.LogEvery = d } }

// WithFailClosedRetryAfter sets when a request rejected by a fail-closed
// rule whose store failed should come back (default 1 s): HTTP's
// Retry-After on the 503, gRPC's RetryInfo on the UNAVAILABLE.
func WithFailClosedRetryAfter(d time.Duration) Option {
	return func(s *settings.Door) { s.FailRetryAfter = d }
}
