package service

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/rollout"
	"github.com/tollgate/tollgate/internal/door/storekey"
	"github.com/tollgate/tollgate/internal/service/config"
)

// A rule with a rollout (config.Rule.Rollout) decides each descriptor by
// the arm its counter key falls in at the server's clock: the rule itself
// (base, or announced while the new limit is still to come, which the
// header fields announce), or the rule with the new limit (Rolled: its
// current_limit, its counter, the same statistics names). With shadow,
// the keys the new limit does not apply to try it on a state of their own.
// Each arm is counted apart, so that their over-limit ratios can be set
// side by side:
//
//	tollgate_serve_rollout_decisions_total{domain, rule, arm, outcome}
//
// arm base, announced, rolled or shadow; outcome as in
// tollgate_serve_decisions_total. Rules come from the rules files, which
// bound them.

// armLabels are the arm label values, by enforce.Arm; armShadow follows.
var armLabels = [...]string{rollout.Base: "base", rollout.Announced: "announced", rollout.Rolled: "rolled", armShadow: "shadow"}

const armShadow = rollout.Rolled + 1

func newRolloutMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_rollout_decisions_total",
		Help: "Descriptors of rules with a rollout, by domain, rule, arm (base, announced, rolled, shadow: the new limit tried by a key it does not apply to yet) and outcome.",
	}, []string{"domain", "rule", "arm", "outcome"})
}

// rolledState is the state of r.Rolled, the rule as the rollout's keys
// see it, next to the state st of r; nil for a rule without a rollout.
func (s *Server) rolledState(r *config.Rule) *ruleState {
	if r.Rolled == nil {
		return nil
	}
	rolled := &ruleState{rule: r.Rolled, point: s.point(r.Rolled)}
	rolled.limit = &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.Rolled.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(r.Unit)}
	return rolled
}

// chooseArm puts the descriptor of it in its arm of the rule's rollout:
// for the new limit, it.rule and it.state become the rolled rule's. With
// shadow, a key the new limit does not apply to tries it on its shadow
// state, hits of it spent there (a stream-done call charges nothing to
// the shadow).
func (s *Server) chooseArm(q *engine.Request, domain string, entries []*rlv3.RateLimitDescriptor_Entry, it *item, hits int) {
	r, ro := it.rule, it.rule.Rollout
	key := counterKey(domain, entries, r)
	it.arm, it.rollout = rollout.Of(ro, key, s.now()), true
	if it.arm == rollout.Rolled {
		it.rule, it.state = r.Rolled, it.state.rolled
		return
	}
	if !ro.Shadow || it.phase == phaseStreamDone || hits == 0 {
		return
	}
	shadow := s.point(r)
	shadow.DryRun, shadow.Mode, shadow.Latency = true, enforce.FailOpen, nil
	st := q.Spend(&shadow, "", storekey.Shadow(key), ro.Limit, cost(hits, r.Cost))
	if st.Outcome == engine.DryRunDenied {
		st.Outcome = engine.Denied
	}
	s.countArm(r, armShadow, st.Outcome)
}

// countArm counts outcome o of a descriptor of rule r (the rule with the
// rollout) in arm.
func (s *Server) countArm(r *config.Rule, arm rollout.Arm, o engine.Outcome) {
	s.m.rollouts.WithLabelValues(r.Domain, r.ID, armLabels[arm], decisionLabels[o]).Inc()
}

// announcement is the header fields' view of the new limit of rule r's
// rollout, still to come: a policy named after the rule's, with ":next".
func announcement(r *config.Rule) headers.Decision {
	d := headerDecision(r, engine.Allowed, tollgate.Result{Limit: r.Rollout.Limit})
	d.Policy += ":next"
	d.From = r.Rollout.From
	return d
}
