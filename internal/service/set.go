package service

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// What a rule of several limits (rate_limits, config.Rule.Set) does with a
// descriptor's hits. The limits share the descriptor's counter key: the
// store keeps each limit's state apart by its algorithm and period, and on
// Redis the states share the key's hash tag, so one Cluster slot.
//
//   - A decision spends the hits under every limit or under none, in one
//     store call (engine.Request.SpendAll, a tollgate.Combiner's
//     AllowAll: memorystore, redisstore and tiered are Combiners; with
//     another store every answer is the rule's failure mode). A limit with
//     a penalty is looked at first, and its denials count towards it, as
//     for a rule of one limit; while it runs the whole set is denied.
//   - A look (hits 0) looks at every limit, a store call each.
//   - A stream-done call charges its hits to every limit, a store call
//     each: a charge never denies, so there is nothing to decide together.
//     When the store fails part way, what was charged stays charged and
//     the failure mode answers.
//   - With WithEnvoyCompat a denied set spends nothing, as always: envoy's
//     counting of denied hits (spendDenied) would spend some limits of a
//     request the set refused. limit_remaining is still 0.
//
// The descriptor's status reports the limit that decided: when denied, the
// denying limit with the longest wait; when admitted, the one with the
// least remaining (deciding). tollgate_serve_decisions_total counts the
// descriptor once, under the rule's name; envoy's statistics count each
// limit under its own (config.SetLimit.ID): within_limit the hits it
// spent, over_limit those it denied, and total_hits only the hits of a
// request another limit of the set denied. RateLimit-Policy lists every
// limit as a policy of its own; RateLimit carries the deciding one only.

// setState is what the server keeps of one limit of a rule's set.
type setState struct {
	limit *pb.RateLimitResponse_RateLimit // its current_limit: read-only
	envoy envoyCounters                   // envoy's statistics of the limit
}

// newSetState is the state of the limits of r's set.
func newSetState(r *config.Rule) []setState {
	st := make([]setState, len(r.Set))
	for i := range r.Set {
		l := &r.Set[i]
		st[i].limit = &pb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(l.Unit)}
	}
	return st
}

// spendSet decides hits of the rule of it, a set, and fills st (and
// reset, its duration_until_reset) from the answer of the limit that
// decided. It returns the set's outcome, that limit's result, every
// limit's step and the index of that limit. done says the call is a
// stream-done call, which charges.
func (s *Server) spendSet(q *engine.Request, domain string, entries []*rlv3.RateLimitDescriptor_Entry, it *item, hits int, done bool, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration) (engine.Outcome, tollgate.Result, []engine.Step, int) {
	r := it.rule
	p := s.pointOf(it)
	key := counterKey(domain, entries, r)
	n := cost(hits, r.Cost)
	steps := make([]engine.Step, 0, len(r.Set))
	switch {
	case n == 0:
		for _, l := range r.SetLimits() {
			steps = append(steps, q.Spend(p, "", key, l, 0))
		}
	case done:
		steps = chargeSet(q, p, key, r, n, steps)
	default:
		steps = s.spendAllOrPenalty(q, p, key, r, n, steps)
	}
	o := setOutcome(steps)
	i := deciding(steps)
	res := steps[i].Result
	st.CurrentLimit = it.state.set[i].limit
	switch o {
	case engine.FailedOpen, engine.FailedClosed:
		traceStoreFailure(q.Context(), o, firstErr(steps))
	case engine.Allowed, engine.Charged:
		st.LimitRemaining = remaining(res)
		if res.ResetAfter > 0 {
			st.DurationUntilReset = roundUp(res.ResetAfter, reset)
		}
	case engine.Denied:
		if steps[i].Err == nil { // not a cost above what a limit can ever admit
			st.LimitRemaining = remaining(res)
			st.DurationUntilReset = roundUp(res.RetryAfter, reset)
			if s.envoy.compat {
				st.LimitRemaining = 0
			}
		}
	}
	return o, res, steps, i
}

// spendAllOrPenalty spends n under every limit of r, a set, for key, all
// or nothing, appending each limit's step to dst; unless r has a penalty
// that runs for key: then the limit it follows denies to the penalty's
// end and the others are not asked (their steps Allowed, with only their
// Limit). A denial by that limit counts towards the penalty, and when it
// starts one, it waits the penalty out too.
func (s *Server) spendAllOrPenalty(q *engine.Request, p *engine.Point, key string, r *config.Rule, n int, dst []engine.Step) []engine.Step {
	ls := r.SetLimits()
	if r.Penalty == nil {
		return q.SpendAll(p, "", key, ls, n, dst)
	}
	start := len(dst)
	if pst, out := q.Penalized(p, "", key, ls[r.PenaltyLimit], r.Penalty); out {
		for _, l := range ls {
			st := engine.Step{Outcome: engine.Allowed, Result: tollgate.Result{Limit: l}}
			if pst.Outcome == engine.FailedOpen || pst.Outcome == engine.FailedClosed {
				st.Outcome, st.Err = pst.Outcome, pst.Err
			}
			dst = append(dst, st)
		}
		dst[start+r.PenaltyLimit] = pst
		return dst
	}
	dst = q.SpendAll(p, "", key, ls, n, dst)
	if st := &dst[start+r.PenaltyLimit]; denied(st.Outcome) && st.Err == nil {
		if started, wait := q.Trip(p, "", key, r.Penalty); started {
			st.Result.RetryAfter = max(st.Result.RetryAfter, wait)
			s.m.penalties.WithLabelValues(r.Domain, r.ID).Inc()
		}
	}
	return dst
}

// chargeSet charges n to every limit of r, a set, for key (see charge),
// appending each limit's step to dst: Charged with the limit's state
// after the charge, or the failure mode's outcome.
func chargeSet(q *engine.Request, p *engine.Point, key string, r *config.Rule, n int, dst []engine.Step) []engine.Step {
	o := failed(p)
	for _, l := range r.SetLimits() {
		res, err := q.Charge(p, "", o.String(), key, l, n)
		st := engine.Step{Outcome: engine.Charged, Result: res}
		if err != nil {
			st = engine.Step{Outcome: o, Result: tollgate.Result{Limit: l}, Err: err}
		}
		dst = append(dst, st)
	}
	return dst
}

// setOutcome is the outcome of a set from its limits' steps: a failure
// when the store failed (for any limit, as a charge may), denied when a
// limit denied, else what every limit did.
func setOutcome(steps []engine.Step) engine.Outcome {
	o := steps[0].Outcome
	for i := range steps {
		switch so := steps[i].Outcome; {
		case so == engine.FailedOpen || so == engine.FailedClosed:
			return so
		case denied(so):
			o = engine.Denied
		}
	}
	return o
}

// denied reports whether o is a limit's denial, dry run or not.
func denied(o engine.Outcome) bool { return o == engine.Denied || o == engine.DryRunDenied }

// firstErr is the first error of steps.
func firstErr(steps []engine.Step) error {
	for i := range steps {
		if steps[i].Err != nil {
			return steps[i].Err
		}
	}
	return nil
}

// deciding returns the index of the limit that decided a set, whose
// answer the descriptor's status carries: among denials, the one with the
// longest RetryAfter, so that waiting it out is enough unless others
// spend meanwhile; when no limit denied, the one with the least Remaining
// and among those the longest ResetAfter — the order in which
// headers.Binding picks the binding decision of a response.
func deciding(steps []engine.Step) int {
	b := 0
	for i := 1; i < len(steps); i++ {
		x, y := &steps[i], &steps[b]
		xd, yd := denied(x.Outcome), denied(y.Outcome)
		switch {
		case xd != yd:
			if xd {
				b = i
			}
		case xd:
			if x.Result.RetryAfter > y.Result.RetryAfter {
				b = i
			}
		case x.Result.Remaining < y.Result.Remaining,
			x.Result.Remaining == y.Result.Remaining && x.Result.ResetAfter > y.Result.ResetAfter:
			b = i
		}
	}
	return b
}

// countSet adds the n hits of a set's descriptor to envoy's statistics of
// each of its limits (see the top of this file), each under its own name:
// the limit's ID, or the request's name for the rule (name, with
// detailed_metric or value_to_metric) followed by the limit's step.
func (s *Server) countSet(it *item, entries []*rlv3.RateLimitDescriptor_Entry, name string, a *answered, n int) {
	r := it.rule
	for j := range a.set {
		step := &a.set[j]
		lname := ""
		if name != "" && name != r.ID {
			lname = s.names.bounded(r.Domain, name+"."+r.Set[j].Step)
		}
		var h [numEnvoyStats]uint64
		if denied(a.o) && !denied(step.Outcome) {
			h[statTotalHits] = uint64(max(n, 0)) // another limit denied the request
		} else {
			h = s.envoyHits(r.Set[j].Limit.Capacity(), step.Outcome, n, step.Result)
		}
		s.countSetEnvoy(it, j, lname, h)
	}
}

// countSetEnvoy adds hits h to envoy's statistics of limit j of the set of
// it, under name ("": the limit's own).
func (s *Server) countSetEnvoy(it *item, j int, name string, h [numEnvoyStats]uint64) {
	r := it.rule
	if name == "" {
		name = r.Set[j].ID
	}
	if s.stats != nil {
		c := &it.state.set[j].envoy
		if name != r.Set[j].ID {
			s.stats.forName(r.Domain, name).add(h)
		} else if rs := c.p.Load(); rs != nil {
			rs.add(h)
		} else {
			rs := s.stats.forName(r.Domain, name)
			c.p.Store(rs)
			rs.add(h)
		}
	}
	if s.sink != nil {
		s.sink.AddHits(r.Domain, name, false, h)
	}
}

// setDecisions appends to hds the header fields' view of every limit of
// a set's answer a, each a policy named after the limit: the limit that
// decided stands for the set in RateLimit and the single-value fields,
// the others are listed in RateLimit-Policy only.
func (s *Server) setDecisions(hds []headers.Decision, r *config.Rule, a *answered) []headers.Decision {
	for j := range a.set {
		l := &r.Set[j]
		policy := l.Name
		if policy == "" {
			policy = l.ID
		}
		res := a.set[j].Result
		res.Allowed = a.set[j].Outcome == engine.Allowed
		if s.envoy.compat && a.o != engine.Allowed {
			res.Remaining = 0 // as the status says (spendSet)
		}
		hds = append(hds, headers.Decision{Policy: policy, Result: res, DryRun: r.DryRun, PolicyOnly: j != a.at})
	}
	return hds
}
