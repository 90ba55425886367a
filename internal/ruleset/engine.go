// Package ruleset is the decision engine of every door and the rule
// machinery the transports share. Engine is the one step that spends a
// limit for a key — deadline, failure mode, dry run, store metrics, sampled
// failure logs — and httplimit, grpclimit and the decision service (package
// server) all decide through it. On top of it, Rules holds options, rule
// checks, keys and the decision loop of the middleware. It knows nothing of
// HTTP or gRPC: httplimit and grpclimit each say which requests a rule matches
// (patterns, methods), where key values come from (headers, metadata, the
// peer) and how a rejection is written (429 with a problem body,
// RESOURCE_EXHAUSTED with RetryInfo); the rest is Rules, generic over the
// transport's request type. The model is described in package enforce,
// which holds the vocabulary users see (Policy, FailureMode, Metrics).
package ruleset

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/guard"
)

// DefaultTimeout bounds each rule's store calls when no WithTimeout is given:
// long enough for a Redis round trip under load, short enough that a hung
// Redis cannot hold requests.
const DefaultTimeout = 50 * time.Millisecond

// DefaultLogInterval is how often, at most, failures are logged: every
// door (httplimit, grpclimit, the decision service) uses the same.
const DefaultLogInterval = guard.DefaultInterval

// Policy is a named limit: the name is what clients see in RateLimit-Policy
// and RateLimit, and what a 429 body says was violated.
type Policy struct {
	Name  string
	Limit tollgate.Limit
}

// FailureMode says what a rule does when the store cannot decide. It is the
// one failure mode of every door: httplimit and grpclimit rules, and the
// rules files of the decision service (config.FailureMode is this type).
type FailureMode uint8

const (
	// FailDefault, the zero value, defers to the default of whoever applies
	// the rule: Rules fail open; the decision service applies its
	// --failure-mode, and a rule in its rules file without failure_mode
	// has this one.
	FailDefault FailureMode = iota
	// FailOpen lets the request through: the usual choice for read-heavy
	// endpoints, where an outage of the limiter must not take the API down.
	FailOpen
	// FailClosed rejects the request (HTTP 503, gRPC UNAVAILABLE, the
	// service's OVER_LIMIT): for login, payments and anything where
	// unlimited traffic is the bigger risk.
	FailClosed
)

// String returns "fail_open", "fail_closed" or "default".
func (m FailureMode) String() string {
	switch m {
	case FailDefault:
		return "default"
	case FailOpen:
		return "fail_open"
	case FailClosed:
		return "fail_closed"
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m))
}

// Outcome is what a rule did with a request, as counted in metrics.
type Outcome uint8

const (
	// Allowed: every policy admitted the request.
	Allowed Outcome = iota
	// Denied: a policy denied it (or it costs more than a policy can ever
	// admit).
	Denied
	// DryRunDenied: a dry-run rule would have denied it; it went through.
	DryRunDenied
	// FailedOpen: the store failed and the rule let the request through.
	FailedOpen
	// FailedClosed: the store failed and the rule rejected the request.
	FailedClosed

	numOutcomes
)

var outcomeNames = [numOutcomes]string{"allowed", "denied", "dry_run_denied", "fail_open", "fail_closed"}

// String returns the outcome's metric label: "allowed", "denied",
// "dry_run_denied", "fail_open" or "fail_closed".
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Blocks reports whether the request must be rejected.
func (o Outcome) Blocks() bool { return o == Denied || o == FailedClosed }

// Verdict is a rule's decision on one request.
type Verdict struct {
	Outcome Outcome
	// Policy is the binding policy: the one that denied the request, or
	// when all admitted it, the one closest to running out. Empty when the
	// store failed before any policy answered.
	Policy string
	// Result is the binding policy's result.
	Result tollgate.Result
	// Delay is how long an admitted request must wait before it goes: the
	// longest shaping delay of the policies (a LeakyBucket with MaxDelay).
	Delay time.Duration
	// Rule names the rule that blocked the request (Rules.Decide).
	Rule string
	// Err is why the store could not decide (FailedOpen, FailedClosed), or
	// for Denied, tollgate.ErrCostExceedsBurst when the request costs more
	// than the policy can ever admit, so retrying is pointless.
	Err error
}

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
		timeout: DefaultTimeout, logEvery: DefaultLogInterval, now: time.Now,
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

// WithMetrics records decisions, store latency and store errors in m,
// which may be shared by several transports.
func WithMetrics(m *Metrics) Option { return func(s *settings) { s.metrics = m } }

// WithRegistry registers the metrics of a transport built on Rules
// (tollgate_<subsystem>_decisions_total, …_store_duration_seconds,
// …_store_errors_total; see Metrics) on reg, unless WithMetrics is given.
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

func newEngine(store tollgate.Store, s settings) *Engine {
	return NewEngine(store, s.timeout, s.logger, s.logEvery, s.now)
}

// rule is a prepared rule: its name, failure mode and dry-run flag, bound to
// an engine and to its metrics. Made once per rule at start and shared.
type rule struct {
	name   string
	dryRun bool
	m      ruleMetrics
	point  Point
}

// rule prepares a rule; FailDefault fails open. The name must be 1 to 64 printable ASCII characters
// without ':' (it namespaces keys and labels metrics).
func newRule(m *Metrics, name string, mode FailureMode, dryRun bool) (*rule, error) {
	if err := checkName("rule", name); err != nil {
		return nil, err
	}
	if mode > FailClosed {
		return nil, fmt.Errorf("rule %q: unknown failure mode %d", name, mode)
	}
	if mode == FailDefault {
		mode = FailOpen // the default of Rules
	}
	r := &rule{name: name, dryRun: dryRun}
	if m != nil {
		r.m = m.forRule(name)
	}
	r.point = Point{Rule: name, Mode: mode, DryRun: dryRun, Latency: r.m.latency, Errors: r.m.errors}
	return r, nil
}

// checkName reports whether name is usable as a rule or policy name: 1 to 64
// printable ASCII characters without ':' or '"'. what names it in the error.
func checkName(what, name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("a %s name must be 1 to 64 characters, got %q", what, name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e || c == ':' || c == '"' || c == '\\' {
			return fmt.Errorf("%s name %q: only printable ASCII without spaces, ':', '\"' or '\\'", what, name)
		}
	}
	return nil
}

// checkPolicies reports whether policies can be used together in one rule:
// valid names and limits, and no two sharing an algorithm and a period, which
// would make them share one counter for a key.
func checkPolicies(policies []Policy) error {
	if len(policies) == 0 {
		return errors.New("a rule needs at least one policy")
	}
	for i, p := range policies {
		if err := checkName("policy", p.Name); err != nil {
			return err
		}
		if err := p.Limit.Validate(); err != nil {
			return fmt.Errorf("policy %q: %w", p.Name, err)
		}
		for _, q := range policies[:i] {
			if q.Name == p.Name {
				return fmt.Errorf("two policies named %q", p.Name)
			}
			if q.Limit.Algorithm == p.Limit.Algorithm && q.Limit.Period == p.Limit.Period {
				return fmt.Errorf("policies %q and %q are both %s per %v: they would share one counter; give them different periods or algorithms", q.Name, p.Name, p.Limit.Algorithm, p.Limit.Period)
			}
		}
	}
	return nil
}

// decide decides the request identified by key under policies, spending
// cost (at least 1) on each policy that admits it, in order, and stopping at
// the first that denies. It appends one headers.Decision per policy that
// answered to dst (marked DryRun for a dry-run rule) and returns it with the
// verdict.
//
// When hold is not nil the rule settles: it reserves through the store's
// ReserveN, and appends each admitted reservation to *hold, under the
// rule's index idx.
func (r *rule) decide(q *Request, key string, policies []Policy, cost int, dst []headers.Decision, idx int, hold *[]held) (Verdict, []headers.Decision) {
	v := Verdict{Outcome: Allowed, Rule: r.name}
	first := len(dst)
	for _, p := range policies {
		var st Step
		if hold == nil {
			st = q.Spend(&r.point, p.Name, key, p.Limit, cost)
		} else {
			var at int64
			if st, at = q.Reserve(&r.point, p.Name, key, p.Limit, cost); st.Outcome == Allowed {
				*hold = append(*hold, held{rule: idx, policy: p.Name, key: key, limit: p.Limit, at: at, cost: cost})
			}
		}
		switch st.Outcome {
		case FailedOpen, FailedClosed:
			v = Verdict{Outcome: st.Outcome, Rule: r.name, Policy: p.Name, Err: st.Err}
			r.count(v.Outcome)
			return v, dst
		case Allowed:
			dst = append(dst, headers.Decision{Policy: p.Name, Result: st.Result, DryRun: r.dryRun})
			v.Delay = max(v.Delay, st.Result.Delay)
			continue
		}
		if st.Err != nil {
			// Not a failure: this request can never pass.
			v = Verdict{Outcome: st.Outcome, Rule: r.name, Policy: p.Name, Result: st.Result, Err: st.Err}
			break
		}
		dst = append(dst, headers.Decision{Policy: p.Name, Result: st.Result, DryRun: r.dryRun})
		v.Outcome = st.Outcome
		break
	}
	if v.Err == nil {
		if b := first + bindingAmong(dst[first:]); b >= first {
			v.Policy, v.Result = dst[b].Policy, dst[b].Result
		}
	}
	if v.Outcome == DryRunDenied {
		v.Delay = 0 // a dry run does not shape either
	}
	r.count(v.Outcome)
	return v, dst
}

// bindingAmong is headers.Binding, treating dry-run decisions as binding
// (a dry-run rule reports its own would-be verdict).
func bindingAmong(ds []headers.Decision) int {
	if len(ds) == 0 {
		return -1
	}
	if !ds[0].DryRun {
		return headers.Binding(ds)
	}
	var buf [8]headers.Decision
	tmp := append(buf[:0], ds...)
	for i := range tmp {
		tmp[i].DryRun = false
	}
	return headers.Binding(tmp)
}

func (r *rule) count(o Outcome) {
	if c := r.m.decisions[o]; c != nil {
		c.Inc()
	}
}
