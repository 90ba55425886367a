package config

import (
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/rollout"
)

// A rate_limit may carry a rollout: a new requests_per_unit (or burst)
// for a share of its keys, from an instant, announced until then:
//
//	rate_limit:
//	  unit: minute
//	  requests_per_unit: 100
//	  rollout:
//	    requests_per_unit: 60
//	    percent: 10                  # of the keys, by a stable hash (default 100)
//	    from: 2027-01-01T00:00:00Z   # RFC 3339 (default: at once)
//	    until: 2027-02-01T00:00:00Z  # back to 100 then (default: never)
//	    shadow: true                 # the other keys try 60 on a state of their own
//
// The unit and algorithm stay the rule's, so a key keeps its counter
// across the switch (enforce.Rollout). Widening is editing percent: a
// reload keeps every key's state, and a key in the share stays in it.

var rolloutKeys = []string{"requests_per_unit", "burst", "percent", "from", "until", "shadow"}

// rollout reads the rollout m of rule r, whose limit is already checked,
// into r.Rollout.
func (b *builder) rollout(m *yaml.Node, r *Rule, f *rateLimitFields) {
	if m.Kind != yaml.MappingNode {
		b.errorf(m, "rollout must be a mapping with requests_per_unit or burst, and percent or from, found %s", kindName(m))
		return
	}
	nerr := len(b.errs)
	next := *r // the rule as the rollout's keys see it
	ro := &enforce.Rollout{Percent: 100}
	sub := rateLimitFields{alg: f.alg, burst: f.burst, costNode: f.costNode}
	b.mapping(m, rolloutKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "requests_per_unit":
			if x, ok := b.atLeastOne(v, "a rollout's requests_per_unit"); ok && int64(x) < 1<<32 {
				next.RequestsPerUnit = uint32(x)
			} else if ok {
				b.errorf(v, "requests_per_unit must be below 2^32")
			}
		case "burst":
			sub.burstNode = kn
			if x, ok := b.atLeastOne(v, "burst"); ok {
				sub.burst = x
			}
		case "percent":
			ro.Percent = b.percent(v)
		case "from":
			ro.From = b.instant(v)
		case "until":
			ro.Until = b.instant(v)
		case "shadow":
			ro.Shadow = b.boolean(v)
		}
	})
	if len(b.errs) > nerr {
		return
	}
	if next.RequestsPerUnit == r.RequestsPerUnit && sub.burstNode == nil {
		b.errorf(m, "a rollout needs a new requests_per_unit or burst")
		return
	}
	// The burst of a bucket follows the new rate unless the rule or the
	// rollout sets one (checkLimit).
	next.Limit.Rate = int(next.RequestsPerUnit)
	b.checkLimit(m, &next, &sub)
	ro.Limit = next.Limit
	if err := rollout.Check(ro, r.Limit); err != nil {
		b.errorf(m, "%s", strings.TrimPrefix(err.Error(), "rollout: "))
	}
	if len(b.errs) > nerr {
		return
	}
	r.Rollout, r.rolledPerUnit = ro, next.RequestsPerUnit // Rolled: once the rule is complete (finish)
}

// percent reads a share in percent: a number above 0 and at most 100.
func (b *builder) percent(v *yaml.Node) float64 {
	if v.Kind == yaml.ScalarNode && (v.Tag == "!!int" || v.Tag == "!!float") {
		if x, err := strconv.ParseFloat(v.Value, 64); err == nil && x > 0 && x <= 100 {
			return x
		}
	}
	b.errorf(v, "percent must be a number above 0 and at most 100, found %s", describe(v))
	return 0
}

// instant reads an RFC 3339 time with its offset (2027-01-01T00:00:00Z).
func (b *builder) instant(v *yaml.Node) time.Time {
	if v.Kind == yaml.ScalarNode {
		if t, err := time.Parse(time.RFC3339, v.Value); err == nil {
			return t
		}
	}
	b.errorf(v, "want an RFC 3339 time with its offset, such as 2027-01-01T00:00:00Z, found %s", describe(v))
	return time.Time{}
}
