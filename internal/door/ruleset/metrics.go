package ruleset

import (
	"fmt"

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
//	tollgate_<subsystem>_rollout_decisions_total{rule, policy, arm, outcome}
//	tollgate_<subsystem>_penalties_total{rule, policy}
//
// (the last two only for policies with a rollout or a penalty; see
// enforce.Rollout, enforce.Penalty). outcome is one of allowed, denied, dry_run_denied, fail_open and
// fail_closed, so the throttle ratio is denied / all, and fail-open events
// are counted apart from normal traffic. The store's latency and errors
// include the settles of rules that settle (Spec.Settles), made after the
// response; bad_costs_total counts the real costs responses reported that
// could not be used, the estimate standing instead.
type Metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	errors    *prometheus.CounterVec
	badCosts  *prometheus.CounterVec
	rollouts  *prometheus.CounterVec // see rollout.go
	penalties *prometheus.CounterVec
}

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
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.errors, m.badCosts, m.rollouts, m.penalties} {
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
