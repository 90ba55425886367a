package service

import (
	"math"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// DefaultNearLimitRatio is the share of a limit past which hits count as
// near_limit, as envoyproxy/ratelimit's NEAR_LIMIT_RATIO (0.8).
const DefaultNearLimitRatio = 0.8

// envoyStats are envoyproxy/ratelimit's per-rule statistics, named as its
// Prometheus exporter names them (ratelimit.service.rate_limit.<domain>.
// <key1>.<key2>…<stat> becomes ratelimit_service_rate_limit_<stat>{domain,
// key1, key2}), so that dashboards and alerts built on them keep working.
// Like envoy's, they count hits, not requests: a request of 3 hits adds 3
// to total_hits.
type envoyStats struct {
	vecs [numEnvoyStats]*prometheus.CounterVec
}

const (
	statTotalHits = iota
	statOverLimit
	statNearLimit
	statWithinLimit
	statDryRun // envoy's shadow_mode
	numEnvoyStats
)

var envoyStatNames = [numEnvoyStats]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

var envoyStatHelp = [numEnvoyStats]string{
	"Hits of every descriptor a rule limits, as envoyproxy/ratelimit counts them (labels: the rule's statistics name split as envoy's Prometheus mapping splits it).",
	"Hits over the limit (shadow_mode rules included).",
	"Hits between NEAR_LIMIT_RATIO (--near-limit-ratio) of the limit and the limit.",
	"Hits within the limit.",
	"Hits over the limit of shadow_mode rules, answered OK.",
}

func newEnvoyStats() *envoyStats {
	e := &envoyStats{}
	for i := range numEnvoyStats {
		e.vecs[i] = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_rate_limit_" + envoyStatNames[i], Help: envoyStatHelp[i],
		}, []string{"domain", "key1", "key2"})
	}
	return e
}

func (e *envoyStats) collectors() []prometheus.Collector {
	cs := make([]prometheus.Collector, numEnvoyStats)
	for i, v := range e.vecs {
		cs[i] = v
	}
	return cs
}

// ruleStats are one statistics name's counters.
type ruleStats [numEnvoyStats]prometheus.Counter

// forName returns the counters of the statistics name id (domain.key1.key2…)
// of a rule of domain: key1 and key2 are the first two dot-separated parts
// after the domain (key2 empty when there is one), as envoy's default
// Prometheus mapping reads them.
func (e *envoyStats) forName(domain, id string) *ruleStats {
	rest := sanitizeStat(strings.TrimPrefix(strings.TrimPrefix(id, domain), "."))
	key1, key2, _ := strings.Cut(rest, ".")
	key2, _, _ = strings.Cut(key2, ".")
	var rs ruleStats
	for i, v := range e.vecs {
		rs[i] = v.WithLabelValues(domain, key1, key2)
	}
	return &rs
}

// sanitizeStat replaces what envoy's statistics names cannot hold (':'
// and '|') by '_', and the dots of an IPv4 address too, so that an address
// is one part of the name, as envoy's SanitizeStatName does.
func sanitizeStat(s string) string {
	if strings.ContainsAny(s, ":|") {
		s = strings.Map(func(r rune) rune {
			if r == ':' || r == '|' {
				return '_'
			}
			return r
		}, s)
	}
	if strings.Count(s, ".") >= 3 && ipv4Stat.MatchString(s) {
		s = ipv4Stat.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
	}
	return s
}

var ipv4Stat = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// envoyCounters are a rule state's statistics, made on first use.
type envoyCounters struct {
	p atomic.Pointer[ruleStats]
}

// statsFor returns the statistics of a descriptor of the rule of it under
// statistics name name ("": the rule's own).
func (s *Server) statsFor(it *item, name string) *ruleStats {
	r := it.rule
	if name == "" {
		if rs := it.state.envoy.p.Load(); rs != nil {
			return rs
		}
		rs := s.stats.forName(r.Domain, r.ID)
		it.state.envoy.p.Store(rs)
		return rs
	}
	return s.stats.forName(r.Domain, name)
}

// envoyHits returns a decided descriptor's n hits by envoyproxy/ratelimit's
// statistics of its rule, as envoy counts them. Its counter stands at
// "before" hits when the request came and "after" with its n hits added,
// decided or not (the limit's capacity less what the result says
// remains); hits past the limit are over_limit, hits between the
// near-limit threshold and the limit near_limit.
//
// capacity is the most the limit holds (0 for a rule of requests_per_unit
// 0): ruleCapacity.
func (s *Server) envoyHits(capacity int, o engine.Outcome, n int, res tollgate.Result) (h [numEnvoyStats]uint64) {
	hits := uint64(max(n, 0))
	h[statTotalHits] = hits
	if !rated(o) {
		return h // failure modes: the store did not say where the counter stands
	}
	limit := uint64(max(capacity, 0))
	near := uint64(math.Floor(float64(float32(limit) * float32(s.envoy.nearLimitRatio))))
	left := min(uint64(max(res.Remaining, 0)), limit)
	var before, after uint64
	if o == engine.Allowed {
		after = limit - left
		before = after - min(hits, after)
	} else {
		before = limit - left
		after = before + hits
	}
	if o == engine.Allowed {
		h[statWithinLimit] = hits
		if after > near {
			h[statNearLimit] = after - max(near, before)
		}
		return h
	}
	over := hits
	if before < limit {
		over = after - limit
		h[statNearLimit] = limit - max(near, before)
	}
	h[statOverLimit] = over
	if o == engine.DryRunDenied {
		h[statDryRun] = over
	}
	return h
}

// ruleCapacity is the capacity envoyHits counts a rule of one limit
// against: its limit's, or 0 for a rule of requests_per_unit 0.
func ruleCapacity(r *config.Rule) int {
	if r.DenyAll() {
		return 0
	}
	return r.Limit.Capacity()
}

// add adds hits h to the counters.
func (rs *ruleStats) add(h [numEnvoyStats]uint64) {
	for i, n := range h {
		if n > 0 {
			rs[i].Add(float64(n))
		}
	}
}
