package service

import (
	"sync"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/internal/service/config"
)

// A rule's statistics are named after the rule (config.MetricID), except
// where envoyproxy/ratelimit names them after the request: detailed_metric,
// value_to_metric, and a descriptor's own limit. There the caller picks
// the label values — and every new one is a series of its own in
// tollgate_serve_decisions_total and in the five envoy statistics, kept
// until the process ends. Before these bounds 300 requests of 64
// descriptors, each with its own limit and a different 900-byte value,
// made 115,247 series and a 112 MB /metrics.
//
// So such names are bounded: a name longer than the byte bound, or new
// once the count bound is reached, is counted under its domain's overflow
// name instead, domain + "." + OverflowName (envoy's key1 label
// OverflowName), and in tollgate_serve_metric_names_folded_total by
// reason. The names kept are the first seen, for the life of the process:
// a series that disappeared would reset its counters.
const (
	// OverflowName is the statistics name part that request-dependent
	// names past the bounds are counted under.
	OverflowName = "__overflow__"
	// DefaultMaxMetricNames is how many request-dependent statistics
	// names are kept unless WithMaxMetricNames says otherwise. Each is up
	// to six series (five envoy statistics and a decision outcome or
	// two): about 7,000 series at most.
	DefaultMaxMetricNames = 1000
	// DefaultMaxMetricNameBytes is the longest request-dependent statistics
	// name kept unless WithMaxMetricNameBytes says otherwise: the domain
	// and the entries' keys and values, "domain.key_value.key_value". A
	// user ID, an address or a path fits; a value long enough to be a
	// token or a payload does not belong in a label.
	DefaultMaxMetricNameBytes = 256
)

// Why a name was folded into the overflow name: the reason label of
// tollgate_serve_metric_names_folded_total.
const (
	foldedTooLong = iota // longer than the byte bound
	foldedTooMany        // past the count bound
	numFolded
)

// metricNames are the request-dependent statistics names kept.
type metricNames struct {
	maxNames, maxBytes int
	folded             [numFolded]prometheus.Counter

	mu    sync.RWMutex
	names map[string]struct{}
}

func newMetricNames(reg prometheus.Registerer, maxNames, maxBytes int) (*metricNames, error) {
	n := &metricNames{maxNames: maxNames, maxBytes: maxBytes, names: make(map[string]struct{})}
	folded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_metric_names_folded_total",
		Help: "Descriptors counted under their domain's overflow statistics name (rule \"<domain>." + OverflowName + "\", key1 \"" + OverflowName + "\") instead of the name their request gave (detailed_metric, value_to_metric, a descriptor's own limit): reason too_long (over --max-metric-name-bytes) or too_many (a new name past --max-metric-names).",
	}, []string{"reason"})
	n.folded[foldedTooLong] = folded.WithLabelValues("too_long")
	n.folded[foldedTooMany] = folded.WithLabelValues("too_many")
	if reg != nil {
		if err := reg.Register(folded); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// of returns the statistics name of a descriptor of entries under rule r
// whose name depends on the request: config.MetricID, or its domain's
// overflow name past the bounds.
func (n *metricNames) of(r *config.Rule, entries []*rlv3.RateLimitDescriptor_Entry) string {
	id := config.MetricID(r, entries)
	if id == r.ID {
		return id // the rule's own: bounded by the rules
	}
	return n.bounded(r.Domain, id)
}

// bounded returns id, a statistics name of domain that depends on the
// request, or domain's overflow name past the bounds. A limit of a set
// (config.SetLimit) has a name of its own beside its rule's, and each
// counts towards the bounds.
func (n *metricNames) bounded(domain, id string) string {
	if len(id) > n.maxBytes {
		n.folded[foldedTooLong].Inc()
		return overflowName(domain)
	}
	n.mu.RLock()
	_, ok := n.names[id]
	n.mu.RUnlock()
	if ok {
		return id
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.names[id]; ok {
		return id
	}
	if len(n.names) >= n.maxNames {
		n.folded[foldedTooMany].Inc()
		return overflowName(domain)
	}
	n.names[id] = struct{}{}
	return id
}

// overflowName is the name domain's statistics past the bounds are
// counted under.
func overflowName(domain string) string { return domain + "." + OverflowName }

// WithMaxMetricNames sets how many request-dependent statistics names
// (detailed_metric, value_to_metric, a descriptor's own limit) get series
// of their own (default DefaultMaxMetricNames); later new names are
// counted under the overflow name. n ≤ 0 keeps the default.
func WithMaxMetricNames(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.maxNames = n
		}
	}
}

// WithMaxMetricNameBytes sets the longest request-dependent statistics
// name that gets series of its own (default DefaultMaxMetricNameBytes);
// longer ones are counted under the overflow name. n ≤ 0 keeps the
// default.
func WithMaxMetricNameBytes(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.maxNameBytes = n
		}
	}
}
