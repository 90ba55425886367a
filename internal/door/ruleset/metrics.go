package ruleset

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tollgate/tollgate/internal/door/engine"
)

// Metrics are the Prometheus metrics of Rules, registered on the
// registry the caller passes (never the global one unless passed):
//
//	tollgate_<subsystem>_decisions_total{rule, outcome}       counter
//	tollgate_<subsystem>_store_duration_seconds{rule}         histogram
//	tollgate_<subsystem>_store_errors_total{rule}             counter
//	tollgate_<subsystem>_bad_costs_total{rule}                counter
//	tollgate_<subsystem>_request_duration_seconds{decision}   histogram
//	tollgate_<subsystem>_rollout_decisions_total{rule, policy, arm, outcome}
//	tollgate_<subsystem>_rollout_request_duration_seconds{rule, policy, arm, decision}
//	tollgate_<subsystem>_penalties_total{rule, policy}
//
// outcome is one of allowed, denied, dry_run_denied, fail_open and
// fail_closed, so the throttle ratio of a rule is its denied / all, and
// fail-open events are counted apart from normal traffic. The store's
// latency and errors include the settles of rules that settle
// (Spec.Settles), made after the response; bad_costs_total counts the real
// costs responses reported that could not be used, the estimate standing
// instead. request_duration_seconds times whole requests by how they left
// (Served), so that throttled traffic is timed apart from the rest. The
// last three exist for policies with a rollout or a penalty (see
// enforce.Rollout, enforce.Penalty).
//
// The labels are bounded: a rule label per rule (at most MaxRules, names
// of at most 64 bytes, all from the program), five outcomes, three
// decisions, and policies and arms the rules name.
type Metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	errors    *prometheus.CounterVec
	badCosts  *prometheus.CounterVec
	rollouts  *prometheus.CounterVec // see rollout.go
	penalties *prometheus.CounterVec
	served    [numServed]prometheus.Observer
	byArm     *prometheus.HistogramVec // see rollout.go
}

// servedBuckets are request_duration_seconds' buckets: from a denial
// answered from memory to a slow handler.
var servedBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Served is how the middleware let a request go: the decision label of
// tollgate_<subsystem>_request_duration_seconds.
type Served uint8

const (
	// Admitted: the handler ran at once. Every rule that applied admitted
	// the request, failed open or only would have denied it (dry run), or
	// no rule applied.
	Admitted Served = iota
	// Delayed: the handler ran after the request waited out its shaping
	// delay.
	Delayed
	// Denied: turned away before the handler: over a limit (429), costing
	// more than a policy can ever admit (413), a fail-closed rule whose
	// store failed, or a shaping delay the request could not wait (503).
	Denied

	numServed
)

var servedNames = [numServed]string{"admitted", "delayed", "denied"}

// String returns the decision label: "admitted", "delayed" or "denied".
func (s Served) String() string { return servedNames[s] }

// ruleMetrics are one rule's children, looked up once so that the request
// path does not hash label values.
type ruleMetrics struct {
	decisions [engine.NumOutcomes]prometheus.Counter
	latency   prometheus.Observer
	errors    prometheus.Counter
	badCosts  prometheus.Counter
	rollouts  *prometheus.CounterVec
	penalties *prometheus.CounterVec
}

// NewMetrics creates the metrics with the given subsystem ("http", "grpc")
// and registers them on reg. It fails if reg already has them: give each
// transport on one registry its own subsystem, or share one Metrics.
func NewMetrics(reg prometheus.Registerer, subsystem string) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tollgate", Subsystem: subsystem, Name: "decisions_total",
			Help: "Rate-limit decisions by rule and outcome (allowed, denied, dry_run_denied, fail_open, fail_closed).",
		}, []string{"rule", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "tollgate", Subsystem: subsystem, Name: "store_duration_seconds",
			Help:    "Time of one store call (one decision under one policy), failures included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"rule"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tollgate", Subsystem: subsystem, Name: "store_errors_total",
			Help: "Store calls that failed or missed their deadline, by rule.",
		}, []string{"rule"}),
		badCosts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tollgate", Subsystem: subsystem, Name: "bad_costs_total",
			Help: "Real costs reported by responses to rules that settle which could not be used (several values, not a number, too large): the estimate stood.",
		}, []string{"rule"}),
	}
	m.rollouts = newRolloutMetric(subsystem)
	m.penalties = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tollgate", Subsystem: subsystem, Name: "penalties_total",
		Help: "Penalties started (enforce.Penalty): keys kept out for a while after tripping a policy, by rule and policy.",
	}, []string{"rule", "policy"})
	served := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "tollgate", Subsystem: subsystem, Name: "request_duration_seconds",
		Help:    "Time from the middleware receiving a request (gRPC: a unary call; streams are not timed) to its handler returning or its rejection being written, by decision: admitted, delayed (waited its shaping delay first) or denied (turned away before the handler).",
		Buckets: servedBuckets,
	}, []string{"decision"})
	m.byArm = newRolloutLatency(subsystem)
	for s := range numServed {
		m.served[s] = served.WithLabelValues(s.String()) // every series visible at 0
	}
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.errors, m.badCosts, served, m.rollouts, m.penalties, m.byArm} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) forRule(rule string) ruleMetrics {
	var rm ruleMetrics
	for o := range engine.NumOutcomes {
		// Creating every child up front makes each series visible at 0.
		rm.decisions[o] = m.decisions.WithLabelValues(rule, o.String())
	}
	rm.latency = m.latency.WithLabelValues(rule)
	rm.errors = m.errors.WithLabelValues(rule)
	rm.badCosts = m.badCosts.WithLabelValues(rule)
	rm.rollouts, rm.penalties = m.rollouts, m.penalties
	return rm
}

// observe records a request that took d and left as s, under the arm of
// each policy with a rollout that decided it too.
func (m *Metrics) observe(s Served, d time.Duration, arms []armSeen) {
	m.served[s].Observe(d.Seconds())
	for _, a := range arms {
		m.byArm.WithLabelValues(a.rule.name, a.policy, armNames[a.arm], s.String()).Observe(d.Seconds())
	}
}
