package service

import (
	"github.com/tollgate/tollgate/internal/door/engine"
)

// StatsSink is where the server sends envoyproxy/ratelimit's statistics,
// besides its own Prometheus metrics, named as envoy names them: to a
// statsd server (envoy's USE_STATSD), or through a statsd mapping applied
// in process (envoy's PROMETHEUS_MAPPER_YAML). Package
// internal/service/statsd has both. Its methods are called on the request
// path: they must not wait.
type StatsSink interface {
	// AddHits adds a decided descriptor's hits to the statistics of its
	// rule's statistics name (domain.key_value.key…: see config.MetricID),
	// in the order total_hits, over_limit, near_limit, within_limit,
	// shadow_mode. fromRequest says that the name holds the request's
	// values and is not bounded yet, which the sink must then do; the
	// server bounds such names itself (metricnames.go) before they come.
	AddHits(domain, name string, fromRequest bool, hits [5]uint64)
	// DomainNotFound counts a descriptor of a domain no rule has: a name
	// the request makes, which the sink must bound too.
	DomainNotFound(domain string)
	// ConfigLoad counts a load of the rules, successful or not.
	ConfigLoad(ok bool)
	// CallFailed counts a request of ShouldRateLimit or /json that failed:
	// by the store (a failure mode answered it) or refused.
	CallFailed(store bool)
	// GlobalShadowMode counts a request over the limit answered OK
	// because of the global dry run (WithDryRun).
	GlobalShadowMode()
}

// WithStatsSink sends envoyproxy/ratelimit's statistics to sink as well.
// When mapped, the sink's mapping is what names envoy's statistics in
// Prometheus (it registers its series on the server's registry): the
// server then leaves out its own ratelimit_service_rate_limit_* metrics,
// whose names the mapping makes.
func WithStatsSink(sink StatsSink, mapped bool) Option {
	return func(s *Server) { s.sink, s.sinkMapped = sink, mapped }
}

// countEnvoy adds a decided descriptor's hits h to envoy's statistics of
// its rule: the server's Prometheus ones, and the sink's.
func (s *Server) countEnvoy(it *item, name string, h [numEnvoyStats]uint64) {
	if s.stats != nil {
		s.statsFor(it, name).add(h)
	}
	if s.sink == nil {
		return
	}
	r := it.rule
	if name == "" {
		name = r.ID
	}
	// The name is the rule's own or one of the bounded names of
	// metricnames.go: the sink need not bound it again.
	s.sink.AddHits(r.Domain, name, false, h)
}

// countStoreFailed counts, in the sink, a request one of whose
// descriptors the store failed to decide, as envoyproxy/ratelimit counts
// a call that failed on Redis (redis_error).
func (s *Server) countStoreFailed(answers []answered) {
	if s.sink == nil {
		return
	}
	for i := range answers {
		if o := answers[i].o; o == engine.FailedOpen || o == engine.FailedClosed {
			s.sink.CallFailed(true)
			return
		}
	}
}
