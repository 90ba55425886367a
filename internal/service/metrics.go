package service

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/internal/door/engine"
)

// numOutcomes is how many ways a descriptor can end: every engine.Outcome
// up to engine.Released.
const numOutcomes = engine.Released + 1

// decisionLabels are the outcome label values of
// tollgate_serve_decisions_total, named as envoyproxy/ratelimit speaks of
// its answers rather than as the middleware's metrics name the same
// outcomes.
var decisionLabels = [numOutcomes]string{
	engine.Allowed:      "ok",
	engine.Denied:       "over_limit",
	engine.DryRunDenied: "shadow",
	engine.Unlimited:    "unlimited",
	engine.FailedOpen:   "fail_open",
	engine.FailedClosed: "fail_closed",
	engine.Charged:      "charged",
	engine.Released:     "released",
}

// api is the way a request came in: the api label of
// tollgate_serve_requests_total.
type api uint8

const (
	apiGRPC  api = iota // ShouldRateLimit
	apiJSON             // POST /json
	apiNginx            // the auth endpoint (AuthHandler)
	apiProxy            // the reverse proxy (Proxy)
	numAPIs
)

var apiNames = [numAPIs]string{"grpc", "json", "nginx", "proxy"}

func (a api) String() string { return apiNames[a] }

// code is a request's overall answer: the code label of
// tollgate_serve_requests_total.
type code uint8

const (
	codeOK code = iota
	codeOverLimit
	codeInvalid // refused before any rule was looked up
	numCodes
)

var codeNames = [numCodes]string{"ok", "over_limit", "invalid"}

func (c code) String() string { return codeNames[c] }

type metrics struct {
	decisions     *prometheus.CounterVec
	rollouts      *prometheus.CounterVec // rollout.go
	penalties     *prometheus.CounterVec
	requests      [numAPIs][numCodes]prometheus.Counter
	noRule        [3]prometheus.Counter // by noRuleDomain, noRuleMatch, noRuleMissing
	storeDuration prometheus.Histogram
	storeErrors   [2]prometheus.Counter // by storeTimeout, storeError
	storeSkipped  prometheus.Counter
	invalid       [numInvalid]prometheus.Counter
	reloads       [3]prometheus.Counter // success, failure, unchanged
	lastReload    prometheus.Gauge
	rules         prometheus.Gauge
	ready         prometheus.Gauge
	storeUp       prometheus.Gauge
	globalDryRun  prometheus.Counter
}

// Why a descriptor has no rule: the reason label of
// tollgate_serve_no_rule_total.
const (
	noRuleDomain  = iota // unknown_domain
	noRuleMatch          // no_match
	noRuleMissing        // missing_value: the /auth or proxy descriptor lacked a value
)

// How a store call failed: the reason label of
// tollgate_serve_store_errors_total.
const (
	storeTimeout = iota
	storeError
)

// The result label of tollgate_serve_config_reloads_total.
const (
	reloadSuccess = iota
	reloadFailure
	reloadUnchanged
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_serve_decisions_total",
			Help: "Descriptors decided, by domain, rule (envoy-style statistics name) and outcome: ok, over_limit, shadow (over the limit of a shadow_mode rule, a dry run, and answered OK), unlimited, fail_open and fail_closed (the store failed or missed its deadline), charged (hits a stream-done call charged) and released (a concurrency slot a stream-done call gave back).",
		}, []string{"domain", "rule", "outcome"}),
		storeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tollgate_serve_store_duration_seconds",
			Help:    "Time of one store call (one descriptor), errors included.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}),
		lastReload: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_serve_config_last_reload_success_timestamp_seconds",
			Help: "When rules were last loaded successfully (Unix time).",
		}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_serve_rules",
			Help: "Rules (rate_limit blocks) loaded.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_serve_ready",
			Help: "1 when /readyz answers 200: rules loaded, store reachable, not shutting down.",
		}),
		storeUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_serve_store_up",
			Help: "1 when the last probe of the store succeeded.",
		}),
		storeSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_serve_store_skipped_total",
			Help: "Descriptors answered by failure mode without a store call because their request's deadline had already passed (after a store call of the same request timed out).",
		}),
		rollouts: newRolloutMetric(),
		penalties: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_serve_penalties_total",
			Help: "Penalties started by rules with a penalty: counters kept out for a while after tripping their limit, by domain and rule.",
		}, []string{"domain", "rule"}),
		globalDryRun: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_serve_global_shadow_total",
			Help: "Requests over the limit answered OK because of the global dry run (--shadow-mode).",
		}),
	}
	cs := append([]prometheus.Collector{m.decisions, m.rollouts, m.penalties, m.storeDuration, m.storeSkipped, m.lastReload, m.rules, m.ready, m.storeUp, m.globalDryRun},
		m.children()...)
	if reg != nil {
		for _, c := range cs {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("server: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// children makes the counter families whose label values are all known
// beforehand and looks up each of their children once, so that the
// request path does not hash label values. It returns the families, to
// be registered.
func (m *metrics) children() []prometheus.Collector {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_requests_total",
		Help: "Requests answered, by API (grpc, json, nginx, proxy) and overall code (ok, over_limit, invalid).",
	}, []string{"api", "code"})
	for a := range numAPIs {
		for c := range numCodes {
			m.requests[a][c] = requests.WithLabelValues(a.String(), c.String())
		}
	}
	noRule := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_no_rule_total",
		Help: "Descriptors that matched no rule and were answered OK: reason unknown_domain, no_match, or missing_value (a descriptor of /auth or the proxy left out because the request lacked a value it needs, such as a header).",
	}, []string{"reason"})
	m.noRule[noRuleDomain] = noRule.WithLabelValues("unknown_domain")
	m.noRule[noRuleMatch] = noRule.WithLabelValues("no_match")
	m.noRule[noRuleMissing] = noRule.WithLabelValues("missing_value")
	storeErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_store_errors_total",
		Help: "Store calls that failed: reason timeout (the deadline passed) or error. A request counts at most one timeout: after it, the request's other descriptors are not sent (tollgate_serve_store_skipped_total).",
	}, []string{"reason"})
	m.storeErrors[storeTimeout] = storeErrors.WithLabelValues("timeout")
	m.storeErrors[storeError] = storeErrors.WithLabelValues("error")
	invalid := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_invalid_total",
		Help: "Requests refused as invalid (gRPC InvalidArgument, HTTP 400 or 413), by reason: request, too_many_descriptors, too_many_entries, hits, override, too_large, auth, phase.",
	}, []string{"reason"})
	for r := range numInvalid {
		m.invalid[r] = invalid.WithLabelValues(r.String())
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_config_reloads_total",
		Help: "Rule loads: result success, failure (the previous rules stay) or unchanged.",
	}, []string{"result"})
	m.reloads[reloadSuccess] = reloads.WithLabelValues("success")
	m.reloads[reloadFailure] = reloads.WithLabelValues("failure")
	m.reloads[reloadUnchanged] = reloads.WithLabelValues("unchanged")
	return []prometheus.Collector{requests, noRule, storeErrors, invalid, reloads}
}
