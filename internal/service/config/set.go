package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate"
)

// A descriptor may carry several limits at once, a plan such as "10 a
// second and 10,000 a day", as a list in rate_limits instead of one
// rate_limit:
//
//	- key: plan
//	  value: pro
//	  rate_limits:
//	    - {unit: second, requests_per_unit: 10, algorithm: token_bucket}
//	    - {unit: day, requests_per_unit: 10000}
//
// A request spends its hits under every limit of the list or under none:
// one denied by the day's limit spends nothing of the second's. Each
// mapping takes the keys of a rate_limit; what they mean in a set:
//
//   - per limit: unit, requests_per_unit (at least 1), algorithm, burst,
//     calendar and name;
//   - the set's, so equal on every limit that writes it, and a limit that
//     leaves it out has the default: cost (one request spends one cost
//     under every limit) and failure_mode (one store call decides the
//     set, and fails as one);
//   - penalty, on one limit at most: that limit's denials count towards
//     it, and while it runs the whole set is denied (a penalty is kept per
//     counter, and the set has one);
//   - refused: unlimited: true and requests_per_unit: 0 (one decides the
//     set alone: write it as a rate_limit), rollout and replaces (a rule
//     of one limit's); another rule's replaces that names a limit of the
//     set drops the whole set.
//
// The descriptor's own keys (shadow_mode, quota_mode, detailed_metric,
// value_to_metric, share_threshold, metadata) apply to the set as to a
// rate_limit. A descriptor takes rate_limit, rate_limits or concurrency,
// one of them. Two limits of a set may not share a counter: a store keeps
// a limit's state by algorithm and period (or calendar unit and zone), so
// two limits of one algorithm and one unit would count into one state.
//
// Each limit has a statistics name of its own (SetLimit.ID), and each
// counts towards MaxDescriptors, as a descriptor of its own would.

// rateLimits reads a rate_limits list seq: a rule of several limits.
func (b *builder) rateLimits(seq *yaml.Node, domain, id string, path []level) *Rule {
	if seq.Kind != yaml.SequenceNode {
		b.errorf(seq, "rate_limits must be a list of 2 to %d rate_limit mappings, found %s", MaxSetLimits, kindName(seq))
		return nil
	}
	switch n := len(seq.Content); {
	case n < 2:
		b.errorf(seq, "rate_limits needs 2 to %d limits, found %d (a single limit is a rate_limit)", MaxSetLimits, n)
		return nil
	case n > MaxSetLimits:
		b.errorf(deref(seq.Content[MaxSetLimits]), "rate_limits holds %d limits, more than the %d one descriptor may have", n, MaxSetLimits)
		return nil
	}
	if b.ndesc += len(seq.Content) - 1; b.ndesc > b.limits.MaxDescriptors {
		b.tooMany = true
		b.errorf(seq, "more than the limit of %d descriptors (each limit of rate_limits counts as one)", b.limits.MaxDescriptors)
		return nil
	}
	nerr := len(b.errs)
	var ms []member
	for i, item := range seq.Content {
		item = deref(item)
		if item.Kind != yaml.MappingNode {
			b.errorf(item, "a limit of rate_limits must be a mapping with unit and requests_per_unit, found %s", kindName(item))
			continue
		}
		merr := len(b.errs)
		m := member{n: i + 1, m: item, r: Rule{Domain: domain, ID: id, File: b.name, Cost: 1, FailureMode: b.failMode, depth: len(path)}}
		m.f = b.readLimit(item, &m.r, true)
		if len(b.errs) > merr {
			continue
		}
		if b.warn != nil {
			b.rateWarnings(&m.r, &m.f, path)
		}
		ms = append(ms, m)
	}
	r := &Rule{Domain: domain, ID: id, File: b.name, Cost: 1, FailureMode: b.failMode, depth: len(path)}
	b.checkSet(ms, r)
	if len(b.errs) > nerr {
		return nil
	}
	r.Cost, r.FailureMode = ms[0].r.Cost, ms[0].r.FailureMode
	r.Set = make([]SetLimit, len(ms))
	r.setLimits = make([]tollgate.Limit, len(ms))
	for i, m := range ms {
		step := m.step()
		r.Set[i] = SetLimit{ID: id + "." + step, Step: step, Name: m.r.Name, Unit: m.r.Unit, RequestsPerUnit: m.r.RequestsPerUnit,
			Limit: m.r.Limit, Line: m.m.Line, Column: m.m.Column}
		r.setLimits[i] = m.r.Limit
	}
	b.finishRule(r, path)
	return r
}

// member is one limit of a rate_limits list as read: its place in the
// list (from 1), its mapping, and its rule of one limit.
type member struct {
	n int
	m *yaml.Node
	r Rule
	f rateLimitFields
}

// step is the member's part of its statistics name: its name, or its
// unit.
func (m *member) step() string {
	if m.r.Name != "" {
		return m.r.Name
	}
	return m.r.Unit.String()
}

// String names the member in messages: `limit 2 ("burst", 10 per second,
// line 9)`.
func (m *member) String() string {
	name := ""
	if m.r.Name != "" {
		name = fmt.Sprintf("%q, ", m.r.Name)
	}
	return fmt.Sprintf("limit %d (%s%d per %s, line %d)", m.n, name, m.r.RequestsPerUnit, m.r.Unit, m.m.Line)
}

// fitsSet refuses what a limit of a set cannot be, read into r and f; it
// reports false when the limit is not to be read any further.
func (b *builder) fitsSet(r *Rule, f *rateLimitFields) bool {
	if r.Unlimited {
		b.errorf(f.unlimitedKey, "unlimited: true has no place in rate_limits: a request is as limited as the least of a set's limits (for a descriptor without a limit, write rate_limit: {unlimited: true})")
		return false
	}
	if f.rpuNode != nil && r.RequestsPerUnit == 0 {
		b.errorf(f.rpuNode, "requests_per_unit 0 in rate_limits denies every request whatever the other limits say: write it as a rate_limit of its own")
		return false
	}
	if f.rolloutKey != nil {
		b.errorf(f.rolloutKey, "rollout is not supported in rate_limits: a rollout changes the limit of a rule of one limit (rate_limit)")
		f.rolloutNode = nil
	}
	if f.replKey != nil {
		b.errorf(f.replKey, "replaces is not supported in rate_limits (a replaces of another rule that names a limit of the set drops the whole set)")
		f.replNode = nil
	}
	return true
}

// checkSet checks what the limits ms of a set must agree on, and sets
// r's penalty: no two share a counter or a statistics name, they spend one
// cost and fail alike, and at most one has a penalty.
func (b *builder) checkSet(ms []member, r *Rule) {
	for j := range ms {
		y := &ms[j]
		for i := range ms[:j] {
			x := &ms[i]
			lx, ly := x.r.Limit, y.r.Limit
			switch {
			case lx.Algorithm == ly.Algorithm && lx.Period == ly.Period && lx.Calendar == ly.Calendar:
				b.errorf(y.m, "%s would share one counter with %s: both count %s; give them different algorithms or units",
					y, x, counted(&y.r))
			case x.r.Name != "" && x.r.Name == y.r.Name:
				b.errorf(y.f.nameKey, "name %q repeated in rate_limits (first at line %d)", y.r.Name, x.m.Line)
			case x.step() == y.step():
				b.errorf(y.m, "%s and %s would both be named %q in statistics and RateLimit-Policy: give one of them a name", x, y, y.step())
			}
		}
	}
	if len(ms) == 0 {
		return
	}
	first := &ms[0]
	for i := range ms[1:] {
		m := &ms[i+1]
		if m.r.Cost != first.r.Cost {
			b.errorf(at(m.f.costNode, m.m), "cost %d here, but %d for %s: a request spends one cost under every limit of rate_limits, so every limit must have the same cost",
				m.r.Cost, first.r.Cost, first)
		}
		if m.r.FailureMode != first.r.FailureMode {
			b.errorf(at(m.f.failKey, m.m), "failure_mode %s here, but %s for %s: the limits of rate_limits are decided by one store call and fail as one, so every limit must have the same failure_mode",
				modeName(m.r.FailureMode), modeName(first.r.FailureMode), first)
		}
	}
	r.PenaltyLimit = -1
	for i := range ms {
		m := &ms[i]
		if m.r.Penalty == nil {
			continue
		}
		if r.PenaltyLimit >= 0 {
			b.errorf(m.f.penaltyKey, "only one limit of rate_limits may have a penalty (another is at line %d): its denials start it, and while it runs the whole set is denied",
				ms[r.PenaltyLimit].f.penaltyKey.Line)
			continue
		}
		r.Penalty, r.PenaltyLimit = m.r.Penalty, i
	}
	if r.PenaltyLimit < 0 {
		r.PenaltyLimit = 0
	}
}

// counted says what a limit's counter counts: "fixed_window per minute",
// "fixed_window per calendar day in UTC".
func counted(r *Rule) string {
	if c := r.Limit.Calendar; c != (tollgate.Calendar{}) {
		return fmt.Sprintf("%s per calendar %s in %s", r.Limit.Algorithm, c.Unit, c.Zone)
	}
	return fmt.Sprintf("%s per %s", r.Limit.Algorithm, r.Unit)
}

// modeName names a failure mode as a file writes it.
func modeName(m FailureMode) string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "left to the server"
}

// at is n, or else where when n is nil: the node a message points at.
func at(n, where *yaml.Node) *yaml.Node {
	if n != nil {
		return n
	}
	return where
}
