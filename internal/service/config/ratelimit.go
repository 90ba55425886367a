package config

import (
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/calendar"
)

var rateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
	"algorithm", "burst", "failure_mode", "cost", "rollout", "penalty", "calendar"}

func (b *builder) rateLimit(m *yaml.Node, domain, id string, path []level) *Rule {
	if m.Kind != yaml.MappingNode {
		b.errorf(m, "rate_limit must be a mapping with unit and requests_per_unit, found %s", kindName(m))
		return nil
	}
	nerr := len(b.errs)
	r := &Rule{Domain: domain, ID: id, File: b.name, Cost: 1, FailureMode: b.failMode, depth: len(path)}
	f := b.readLimit(m, r, false)
	if f.rolloutNode != nil {
		if r.Unlimited || r.RequestsPerUnit == 0 {
			b.errorf(f.rolloutNode, "a rollout changes a limit: an unlimited rule, or one of requests_per_unit 0, has none")
		} else if len(b.errs) == nerr {
			b.rollout(f.rolloutNode, r, &f)
		}
	}
	if len(b.errs) == nerr && b.warn != nil {
		b.rateWarnings(r, &f, path)
	}
	b.finishRule(r, path)
	if len(b.errs) > nerr {
		return nil
	}
	return r
}

// readLimit reads the rate_limit mapping m into r and checks it, all but
// its rollout, which it leaves to its caller. In a set (a limit of
// rate_limits) it refuses what a limit of a set cannot be: unlimited, of
// requests_per_unit 0, with a rollout or a replaces.
func (b *builder) readLimit(m *yaml.Node, r *Rule, inSet bool) rateLimitFields {
	nerr := len(b.errs)
	f := b.rateLimitFields(m, r)
	if inSet && !b.fitsSet(r, &f) {
		return f
	}
	if f.replNode != nil {
		r.Replaces = b.replaces(f.replNode, r.Name)
	}
	b.checkUnlimited(m, r, &f)
	if !r.Unlimited {
		r.Limit = tollgate.Limit{Algorithm: f.alg, Rate: int(r.RequestsPerUnit), Period: r.Unit.Duration()}
		if f.calNode != nil {
			b.calendar(r, &f)
		}
	}
	// An unlimited rule never reaches the store, and one of
	// requests_per_unit 0 denies without asking it: no limit to check.
	if len(b.errs) == nerr && !r.Unlimited && r.RequestsPerUnit != 0 {
		b.checkLimit(m, r, &f)
	}
	if f.penaltyNode != nil {
		if r.Unlimited || r.RequestsPerUnit == 0 {
			b.errorf(f.penaltyNode, "a penalty follows a limit's denials: an unlimited rule, or one of requests_per_unit 0, has none")
		} else {
			r.Penalty = b.penalty(f.penaltyNode)
		}
	}
	return f
}

// rateLimitFields is what a rate_limit mapping says beyond the fields of
// its Rule: the nodes of its keys (for messages), the algorithm and burst.
type rateLimitFields struct {
	unitNode, rpuNode, algNode, burstNode, costNode, replNode, rolloutNode, penaltyNode *yaml.Node
	alg                                                                                 tollgate.Algorithm
	burst                                                                               int
	// calNode is the calendar key's, zone its value.
	calNode *yaml.Node
	zone    string
	// The keys of what a set refuses or shares (rateLimits), for its
	// messages.
	unlimitedKey, failKey, replKey, rolloutKey, penaltyKey, nameKey *yaml.Node
}

// rateLimitFields reads the rate_limit mapping m into r and the fields
// returned.
func (b *builder) rateLimitFields(m *yaml.Node, r *Rule) rateLimitFields {
	f := rateLimitFields{alg: tollgate.FixedWindow}
	if b.alg != nil {
		f.alg = *b.alg
	}
	b.mapping(m, rateLimitKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "unit":
			f.unitNode = kn
			if u, ok := b.unit(v); ok {
				r.Unit = u
			}
		case "requests_per_unit":
			f.rpuNode = kn
			if x, ok := b.uint(v, 1<<32-1); ok {
				r.RequestsPerUnit = uint32(x)
			}
		case "unlimited":
			f.unlimitedKey = kn
			r.Unlimited = b.boolean(v)
		case "name":
			f.nameKey = kn
			r.Name, _ = b.str(v)
		case "replaces":
			f.replKey, f.replNode = kn, v
		case "algorithm":
			f.algNode = kn
			if a, ok := b.algorithm(v); ok {
				f.alg = a
			}
		case "burst":
			f.burstNode = kn
			if x, ok := b.atLeastOne(v, "burst"); ok {
				f.burst = x
			}
		case "failure_mode":
			f.failKey = kn
			r.FailureMode = b.failureMode(v)
		case "rollout":
			f.rolloutKey, f.rolloutNode = kn, v
		case "penalty":
			f.penaltyKey, f.penaltyNode = kn, v
		case "cost":
			f.costNode = v
			if x, ok := b.atLeastOne(v, "cost"); ok {
				r.Cost = x
			}
		case "calendar":
			f.calNode = kn
			if z, ok := b.str(v); ok && z == "" {
				b.errorf(v, "calendar must name a time zone (an IANA name such as Europe/Berlin, or UTC)")
			} else if ok {
				f.zone = z
			}
		}
	})
	return f
}

// calendar makes r's limit count in the calendar days, weeks or months of
// the zone f names (tollgate.Limit.Calendar) instead of in periods of the
// unit's length. Validate (checkLimit) checks the zone and the algorithm.
func (b *builder) calendar(r *Rule, f *rateLimitFields) {
	switch r.Unit {
	case Day, Week, Month:
	default:
		b.errorf(f.calNode, "calendar applies to the units day, week and month, not %s", r.Unit)
		return
	}
	if f.zone == "" {
		return
	}
	r.Limit.Period = 0
	r.Limit.Calendar = tollgate.Calendar{Unit: r.Unit.String(), Zone: f.zone}
	if r.RequestsPerUnit == 0 {
		// No limit for checkLimit to check, but a window to deny until.
		if _, err := calendar.Lookup(r.Limit.Calendar.Unit, f.zone); err != nil {
			b.errorf(f.calNode, "%s", err)
		}
	}
}

// unit reads a rate limit unit; it reports false when v is no string.
func (b *builder) unit(v *yaml.Node) (Unit, bool) {
	s, ok := b.str(v)
	if !ok {
		return 0, false
	}
	u, err := ParseUnit(s)
	if err != nil {
		b.errorf(v, "invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", s)
	}
	return u, true
}

// algorithm reads an algorithm's name; it reports false when v is no
// string.
func (b *builder) algorithm(v *yaml.Node) (tollgate.Algorithm, bool) {
	s, ok := b.str(v)
	if !ok {
		return 0, false
	}
	a, err := tollgate.ParseAlgorithm(s)
	if err != nil {
		b.errorf(v, "unknown algorithm %q (want one of token_bucket, gcra, fixed_window, sliding_window_log, sliding_window_counter, leaky_bucket)", s)
	}
	return a, true
}

// atLeastOne reads a count of at least 1 (what names it in messages); it
// reports false when v is no number in range.
func (b *builder) atLeastOne(v *yaml.Node, what string) (int, bool) {
	x, ok := b.uint(v, 1<<53)
	if !ok {
		return 0, false
	}
	if x == 0 {
		b.errorf(v, "%s must be at least 1", what)
	}
	return int(x), true
}

// checkUnlimited checks that an unlimited rate_limit m has no unit,
// algorithm, burst or cost, and that any other has a unit and
// requests_per_unit.
func (b *builder) checkUnlimited(m *yaml.Node, r *Rule, f *rateLimitFields) {
	if r.Unlimited {
		if f.unitNode != nil {
			b.errorf(f.unitNode, "should not specify rate limit unit when unlimited")
		}
		for _, n := range []*yaml.Node{f.algNode, f.burstNode, f.costNode, f.calNode} {
			if n != nil {
				b.errorf(n, "an unlimited rate_limit takes no algorithm, burst, cost or calendar")
			}
		}
		return
	}
	if f.unitNode == nil {
		b.errorf(m, "rate_limit needs a unit (second, minute, hour, day, week, month or year), or unlimited: true")
	}
	if f.rpuNode == nil {
		b.errorf(m, "rate_limit needs requests_per_unit (0 denies every request)")
	}
}

// checkLimit sets the burst of r's limit and checks the limit, and that
// r's cost fits in it.
func (b *builder) checkLimit(m *yaml.Node, r *Rule, f *rateLimitFields) {
	switch f.alg {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
		r.Limit.Burst = r.Limit.Rate
		if f.burst > 0 {
			r.Limit.Burst = f.burst
		}
	default:
		if f.burstNode != nil {
			b.errorf(f.burstNode, "burst applies to token_bucket, gcra and leaky_bucket, not to %s (a window admits requests_per_unit per window)", f.alg)
		}
	}
	if err := r.Limit.Validate(); err != nil {
		b.errorf(m, "%s", strings.TrimPrefix(err.Error(), "tollgate: "))
	} else if c := r.Limit.Capacity(); r.Cost > c {
		b.errorf(f.costNode, "cost %d is more than %s can ever admit at once (%d)", r.Cost, r.Limit, c)
	}
}

func (b *builder) replaces(seq *yaml.Node, own string) []string {
	if seq.Kind != yaml.SequenceNode {
		b.errorf(seq, "replaces must be a list of {name: ...}, found %s", kindName(seq))
		return nil
	}
	var names []string
	for _, e := range seq.Content {
		e = deref(e)
		if e.Kind != yaml.MappingNode {
			b.errorf(e, "a replaces entry must be a mapping with a name, found %s", kindName(e))
			continue
		}
		var name string
		b.mapping(e, []string{"name"}, func(_ string, _, v *yaml.Node) { name, _ = b.str(v) })
		switch {
		case name == "":
			b.errorf(e, "should not have an empty replaces entry")
		case name == own:
			b.errorf(e, "replaces should not contain name of same descriptor (%q)", own)
		default:
			names = append(names, name)
		}
	}
	return names
}
