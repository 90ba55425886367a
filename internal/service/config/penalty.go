package config

import (
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
)

// A rate_limit may carry a penalty: once its counter is denied After times
// within Within (the first denial when after is left out), the counter is
// denied for For, whatever the limit would say (enforce.Penalty):
//
//	penalty: {for: 15m, after: 5, within: 10m}

var penaltyKeys = []string{"for", "after", "within"}

// penalty reads the penalty m of a rule.
func (b *builder) penalty(m *yaml.Node) *enforce.Penalty {
	if m.Kind != yaml.MappingNode {
		b.errorf(m, "penalty must be a mapping with for (and after, within), found %s", kindName(m))
		return nil
	}
	nerr := len(b.errs)
	pen := &enforce.Penalty{}
	b.mapping(m, penaltyKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "for":
			pen.For = b.duration(v)
		case "after":
			if x, ok := b.atLeastOne(v, "after"); ok {
				pen.After = x
			}
		case "within":
			pen.Within = b.duration(v)
		}
	})
	if len(b.errs) > nerr {
		return nil
	}
	if err := engine.CheckPenalty(pen); err != nil {
		b.errorf(m, "%s", strings.TrimPrefix(err.Error(), "penalty: "))
		return nil
	}
	return pen
}

// duration reads a positive Go duration (90s, 15m, 1h30m).
func (b *builder) duration(v *yaml.Node) time.Duration {
	if v.Kind == yaml.ScalarNode {
		if d, err := time.ParseDuration(v.Value); err == nil && d > 0 {
			return d
		}
	}
	b.errorf(v, "want a positive duration such as 90s, 15m or 1h30m, found %s", describe(v))
	return 0
}
