package ruleset

import (
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/rollout"
)

// Verdict is a rule's decision on one request.
type Verdict struct {
	Outcome engine.Outcome
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

// rule is a prepared rule: its name, failure mode and dry-run flag, bound to
// an engine and to its metrics. Made once per rule at start and shared.
type rule struct {
	name   string
	dryRun bool
	// together: the store decides a set of policies all or nothing
	// (tollgate.Combiner), so a rule of several decides them so.
	together bool
	m        ruleMetrics
	point    engine.Point
	shadow   engine.Point // a rollout's shadow: never blocks
}

// rule prepares a rule; FailDefault fails open. The name must be 1 to 64 printable ASCII characters
// without ':' (it namespaces keys and labels metrics).
func newRule(m *Metrics, name string, mode enforce.FailureMode, dryRun bool) (*rule, error) {
	if err := checkName("rule", name); err != nil {
		return nil, err
	}
	if mode > enforce.FailClosed {
		return nil, fmt.Errorf("rule %q: unknown failure mode %d", name, mode)
	}
	if mode == enforce.FailDefault {
		mode = enforce.FailOpen // the default of Rules
	}
	r := &rule{name: name, dryRun: dryRun}
	if m != nil {
		r.m = m.forRule(name)
	}
	r.point = engine.Point{Rule: name, Mode: mode, DryRun: dryRun, Latency: r.m.latency, Errors: r.m.errors}
	r.shadow = engine.Point{Rule: name, Mode: enforce.FailOpen, DryRun: true, Errors: r.m.errors}
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
func checkPolicies(policies []enforce.Policy) error {
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
		if p.Rollout != nil {
			if err := rollout.Check(p.Rollout, p.Limit); err != nil {
				return fmt.Errorf("policy %q: %w", p.Name, err)
			}
		}
		if p.Penalty != nil {
			if err := engine.CheckPenalty(p.Penalty); err != nil {
				return fmt.Errorf("policy %q: %w", p.Name, err)
			}
		}
		for _, q := range policies[:i] {
			if q.Name == p.Name {
				return fmt.Errorf("two policies named %q", p.Name)
			}
			if q.Limit.Algorithm == p.Limit.Algorithm && q.Limit.Period == p.Limit.Period && q.Limit.Calendar == p.Limit.Calendar {
				per := p.Limit.Period.String()
				if c := p.Limit.Calendar; c != (tollgate.Calendar{}) {
					per = "calendar " + c.Unit + " in " + c.Zone
				}
				return fmt.Errorf("policies %q and %q are both %s per %s: they would share one counter; give them different periods or algorithms", q.Name, p.Name, p.Limit.Algorithm, per)
			}
		}
	}
	return nil
}

// decide decides the request identified by key under policies, spending
// cost (at least 1). It appends one headers.Decision per policy that
// answered to dst (marked DryRun for a dry-run rule) and returns it with the
// verdict.
//
// Several policies are decided together, all or nothing, when the store
// is a tollgate.Combiner and the rule does not settle (decideTogether).
// Otherwise they spend in order, each that admits spending cost, up to the
// first that denies; when hold is not nil the rule settles: it reserves
// through the store's ReserveN, and appends each admitted reservation to
// *hold, under the rule's index idx, for Decide to refund if the request
// is turned away.
//
// When arms is not nil, the arm of each policy with a rollout is appended
// to *arms, for the request's latency by arm (Rules.Served).
func (r *rule) decide(q *engine.Request, key string, policies []enforce.Policy, cost int, dst []headers.Decision, idx int, hold *[]held, arms *[]armSeen, now func() time.Time) (Verdict, []headers.Decision) {
	if r.together && hold == nil && len(policies) > 1 {
		return r.decideTogether(q, key, policies, cost, dst, arms, now)
	}
	v := Verdict{Outcome: engine.Allowed, Rule: r.name}
	first := len(dst)
	var announce []headers.Decision // after the policies' own, in order
	for _, p := range policies {
		limit, arm := p.Limit, rollout.Base
		if ro := p.Rollout; ro != nil {
			if arm = rollout.Of(ro, key, now()); arm == rollout.Rolled {
				limit = ro.Limit
			}
			r.tryRollout(q, p, key, cost, arm, &announce)
			r.seen(arms, p.Name, arm)
		}
		st := r.spend(q, p, key, limit, cost, idx, hold)
		if p.Rollout != nil {
			r.countArm(p.Name, arm, st.Outcome)
		}
		switch st.Outcome {
		case engine.FailedOpen, engine.FailedClosed:
			v = Verdict{Outcome: st.Outcome, Rule: r.name, Policy: p.Name, Err: st.Err}
			r.count(v.Outcome)
			return v, dst
		case engine.Allowed:
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
	dst = append(dst, announce...)
	if v.Outcome == engine.DryRunDenied {
		v.Delay = 0 // a dry run does not shape either
	}
	r.count(v.Outcome)
	return v, dst
}

// decideTogether is decide for several policies at once: each limit (its
// rollout's, for a key in the rolled arm) is decided by one store call
// that admits the request only if every limit does, and spends nothing of
// any when one denies. A penalty that runs denies first, with nothing
// spent; each policy that denied counts towards its own penalty. Every
// policy's answer is appended: an admission, a denial, or for a policy
// that would have admitted a denied request, what it has left.
func (r *rule) decideTogether(q *engine.Request, key string, policies []enforce.Policy, cost int, dst []headers.Decision, seen *[]armSeen, now func() time.Time) (Verdict, []headers.Decision) {
	var (
		lbuf     [8]tollgate.Limit
		abuf     [8]rollout.Arm
		sbuf     [8]engine.Step
		announce []headers.Decision
	)
	limits, arms := lbuf[:0], abuf[:0]
	for _, p := range policies {
		limit, arm := p.Limit, rollout.Base
		if ro := p.Rollout; ro != nil {
			if arm = rollout.Of(ro, key, now()); arm == rollout.Rolled {
				limit = ro.Limit
			}
			r.tryRollout(q, p, key, cost, arm, &announce)
			r.seen(seen, p.Name, arm)
		}
		limits, arms = append(limits, limit), append(arms, arm)
	}
	steps := sbuf[:0]
	for i, p := range policies {
		if p.Penalty == nil {
			continue
		}
		if st, out := q.Penalized(&r.point, p.Name, key, limits[i], p.Penalty); out {
			v := Verdict{Outcome: st.Outcome, Rule: r.name, Policy: p.Name, Result: st.Result, Err: st.Err}
			if st.Outcome != engine.FailedOpen && st.Outcome != engine.FailedClosed {
				dst = append(dst, headers.Decision{Policy: p.Name, Result: st.Result, DryRun: r.dryRun})
			}
			r.countArms(policies, arms, st.Outcome)
			r.count(v.Outcome)
			return v, append(dst, announce...)
		}
	}
	steps = q.SpendAll(&r.point, policies[0].Name, key, limits, cost, steps)
	v := Verdict{Outcome: engine.Allowed, Rule: r.name}
	for i, st := range steps {
		switch {
		case st.Outcome == engine.FailedOpen || st.Outcome == engine.FailedClosed:
			v = Verdict{Outcome: st.Outcome, Rule: r.name, Err: st.Err}
		case st.Err != nil: // a cost above what the policy can ever admit
			v = Verdict{Outcome: st.Outcome, Rule: r.name, Policy: policies[i].Name, Result: st.Result, Err: st.Err}
		default:
			continue
		}
		r.countArms(policies, arms, st.Outcome)
		r.count(v.Outcome)
		return v, dst
	}
	first := len(dst)
	for i, st := range steps {
		p := policies[i]
		if st.Outcome != engine.Allowed {
			v.Outcome = st.Outcome
			if p.Penalty != nil {
				if started, wait := q.Trip(&r.point, p.Name, key, p.Penalty); started {
					st.Result.RetryAfter = max(st.Result.RetryAfter, wait)
					if r.m.penalties != nil {
						r.m.penalties.WithLabelValues(r.name, p.Name).Inc()
					}
				}
			}
		}
		v.Delay = max(v.Delay, st.Result.Delay)
		dst = append(dst, headers.Decision{Policy: p.Name, Result: st.Result, DryRun: r.dryRun})
	}
	if b := first + bindingAmong(dst[first:]); b >= first {
		v.Policy, v.Result = dst[b].Policy, dst[b].Result
	}
	if v.Outcome != engine.Allowed {
		v.Delay = 0
	}
	r.countArms(policies, arms, v.Outcome)
	r.count(v.Outcome)
	return v, append(dst, announce...)
}

// countArms counts the set's outcome o under the arm of each policy that
// has a rollout.
func (r *rule) countArms(policies []enforce.Policy, arms []rollout.Arm, o engine.Outcome) {
	for i, p := range policies {
		if p.Rollout != nil {
			r.countArm(p.Name, arms[i], o)
		}
	}
}

// spend spends cost of policy p, whose limit for key is limit, or reserves
// it when hold is not nil; a policy with a penalty denies at once while
// the key's penalty runs, and a denial of it counts towards the next one.
func (r *rule) spend(q *engine.Request, p enforce.Policy, key string, limit tollgate.Limit, cost, idx int, hold *[]held) engine.Step {
	if p.Penalty != nil {
		if st, out := q.Penalized(&r.point, p.Name, key, limit, p.Penalty); out {
			return st
		}
	}
	var st engine.Step
	if hold == nil {
		st = q.Spend(&r.point, p.Name, key, limit, cost)
	} else {
		var at int64
		if st, at = q.Reserve(&r.point, p.Name, key, limit, cost); st.Outcome == engine.Allowed {
			*hold = append(*hold, held{rule: idx, policy: p.Name, key: key, limit: limit, at: at, cost: cost})
		}
	}
	if p.Penalty != nil && (st.Outcome == engine.Denied || st.Outcome == engine.DryRunDenied) && st.Err == nil {
		if started, wait := q.Trip(&r.point, p.Name, key, p.Penalty); started {
			st.Result.RetryAfter = max(st.Result.RetryAfter, wait)
			if r.m.penalties != nil {
				r.m.penalties.WithLabelValues(r.name, p.Name).Inc()
			}
		}
	}
	return st
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

func (r *rule) count(o engine.Outcome) {
	if c := r.m.decisions[o]; c != nil {
		c.Inc()
	}
}
