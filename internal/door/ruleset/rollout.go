package ruleset

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/rollout"
	"github.com/tollgate/tollgate/internal/door/storekey"
)

// A policy with a Rollout (enforce.Rollout) decides each key under the limit
// its arm gives it, and counts the decision by arm, so that the 429 ratio
// of the keys under the new limit can be set against the others':
//
//	tollgate_<subsystem>_rollout_decisions_total{rule, policy, arm, outcome}
//
//	tollgate_<subsystem>_rollout_request_duration_seconds{rule, policy, arm, decision}
//
// arm is base (the policy's own limit), announced (its own limit, the new
// one announced), rolled (the new limit) or shadow (the new limit tried on
// a state of its own by a key it does not apply to yet); outcome is the
// rule's (allowed, denied, …). The histogram times the requests of each
// arm as request_duration_seconds times all of them (Rules.Served), so
// that the latency of the keys under the new limit can be set against the
// others' too (a shadow decides no request: it has no latency). Rules and
// policies are the program's, so the series are bounded by them.

// armNames are the arm label values, by enforce.Arm; shadowArm follows.
var armNames = [...]string{rollout.Base: "base", rollout.Announced: "announced", rollout.Rolled: "rolled", shadowArm: "shadow"}

const shadowArm = rollout.Rolled + 1

func newRolloutMetric(subsystem string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tollgate", Subsystem: subsystem, Name: "rollout_decisions_total",
		Help: "Decisions of policies with a rollout, by rule, policy, arm (base, announced, rolled, shadow) and outcome.",
	}, []string{"rule", "policy", "arm", "outcome"})
}

// armSeen is the arm a policy with a rollout put a request in.
type armSeen struct {
	rule   *rule
	policy string
	arm    rollout.Arm
}

// seen appends policy's arm to *arms, if arms is not nil.
func (r *rule) seen(arms *[]armSeen, policy string, arm rollout.Arm) {
	if arms != nil {
		*arms = append(*arms, armSeen{rule: r, policy: policy, arm: arm})
	}
}

func newRolloutLatency(subsystem string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "tollgate", Subsystem: subsystem, Name: "rollout_request_duration_seconds",
		Help:    "Time of the requests a policy with a rollout decided, as request_duration_seconds, by rule, policy, arm (base, announced, rolled) and decision (admitted, delayed, denied).",
		Buckets: servedBuckets,
	}, []string{"rule", "policy", "arm", "decision"})
}

// countArm counts a decision of policy under arm.
func (r *rule) countArm(policy string, arm rollout.Arm, o engine.Outcome) {
	if r.m.rollouts != nil {
		r.m.rollouts.WithLabelValues(r.name, policy, armNames[arm], o.String()).Inc()
	}
}

// tryRollout does what p's rollout asks beside the decision of key under
// arm: it adds the announcement of the new limit to *announce while the
// key waits for it, and, with Shadow, tries the new limit on the key's
// shadow state while it does not apply. The shadow's answer never blocks
// and is only counted; its store failures are counted and logged as any.
func (r *rule) tryRollout(q *engine.Request, p enforce.Policy, key string, cost int, arm rollout.Arm, announce *[]headers.Decision) {
	ro := p.Rollout
	if arm == rollout.Announced {
		*announce = append(*announce, headers.Decision{
			Policy: p.Name + ":next", Result: tollgate.Result{Limit: ro.Limit}, From: ro.From, DryRun: r.dryRun,
		})
	}
	if !ro.Shadow || arm == rollout.Rolled {
		return
	}
	st := q.Spend(&r.shadow, p.Name, storekey.Shadow(key), ro.Limit, cost)
	if st.Outcome == engine.DryRunDenied {
		st.Outcome = engine.Denied
	}
	r.countArm(p.Name, shadowArm, st.Outcome)
}
