package config

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/permit"
)

var concurrencyKeys = []string{"max_in_flight", "lease", "name", "failure_mode"}

// concurrency reads a concurrency mapping: a rule that bounds how many
// requests are in flight at once rather than how often they come.
func (b *builder) concurrency(m *yaml.Node, domain, id string, path []level) *Rule {
	if m.Kind != yaml.MappingNode {
		b.errorf(m, "concurrency must be a mapping with max_in_flight and lease, found %s", kindName(m))
		return nil
	}
	nerr := len(b.errs)
	r := &Rule{Domain: domain, ID: id, File: b.name, Cost: 1, FailureMode: b.failMode, depth: len(path),
		Concurrency: &Concurrency{}}
	var maxNode, leaseNode *yaml.Node
	b.mapping(m, concurrencyKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "max_in_flight":
			maxNode = kn
			if x, ok := b.uint(v, 1<<53); ok {
				if x < 1 || x > tollgate.MaxConcurrency {
					b.errorf(v, "max_in_flight must be 1 to %d, got %d", tollgate.MaxConcurrency, x)
				}
				r.Concurrency.Max = int(min(x, tollgate.MaxConcurrency))
			}
		case "lease":
			leaseNode = kn
			r.Concurrency.Lease = b.lease(v)
		case "name":
			r.Name, _ = b.str(v)
		case "failure_mode":
			r.FailureMode = b.failureMode(v)
		}
	})
	if maxNode == nil {
		b.errorf(m, "concurrency needs max_in_flight: how many requests may be in flight at once (1 to %d)", tollgate.MaxConcurrency)
	}
	if leaseNode == nil {
		b.errorf(m, "concurrency needs a lease: how long a slot stays taken when its release never comes, such as 5m (%v to %v)", tollgate.MinLease, tollgate.MaxLease)
	}
	b.finishRule(r, path)
	if len(b.errs) > nerr {
		return nil
	}
	return r
}

// lease reads a concurrency lease: a Go duration ("90s", "5m") from
// tollgate.MinLease to tollgate.MaxLease.
func (b *builder) lease(v *yaml.Node) time.Duration {
	s, ok := b.str(v)
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		b.errorf(v, "lease %q is not a duration (write it as 30s, 5m or 1h30m)", s)
		return 0
	}
	if _, err := permit.CheckLease(d); err != nil {
		b.errorf(v, "lease %v: a lease must be %v to %v", d, tollgate.MinLease, tollgate.MaxLease)
		return 0
	}
	return d
}
