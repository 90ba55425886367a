// Package series bounds the metric series that callers' values create.
//
// Some of the service's statistics are named after what a request
// carries: envoyproxy/ratelimit's per-rule statistics of a detailed_metric
// or value_to_metric rule, or of a descriptor's own limit, hold descriptor
// values (client addresses, API keys, paths), and its domain_not_found
// statistic holds the request's domain. Left alone, every new value would
// be a new series, kept for the life of the process, so that any caller
// could grow the service's memory and its metrics backend's without end.
//
// A Bound admits at most a number of distinct names, each of at most a
// number of bytes. A name past either bound is folded: its caller counts
// it under Overflow instead, and the Bound counts it in Folded. Names that
// the rules alone make (a rule's own statistics name) are bounded by the
// rules' size, and need no Bound.
package series

import (
	"strings"
	"sync"
	"sync/atomic"
)

const (
	// DefaultMax is how many distinct names a Bound admits by default.
	DefaultMax = 1000
	// DefaultMaxBytes is the longest name, in bytes, a Bound admits by
	// default.
	DefaultMaxBytes = 256
	// Overflow is the name part folded series are counted under: a part
	// no descriptor key of a rule is likely to be.
	Overflow = "__overflow__"
)

// Bound admits names up to a count and a length. It is safe for
// concurrent use; a name already admitted costs one map lookup.
type Bound struct {
	max, maxBytes int
	seen          sync.Map // name → struct{}
	mu            sync.Mutex
	n             int // names in seen; under mu
	folded        atomic.Uint64
}

// New returns a Bound of at most max names of at most maxBytes bytes
// each; 0 or less for either takes its default.
func New(max, maxBytes int) *Bound {
	if max <= 0 {
		max = DefaultMax
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	return &Bound{max: max, maxBytes: maxBytes}
}

// Admit reports whether name may be counted under its own name: it was
// admitted before, or there is room for it and it is short enough. A name
// it refuses is counted in Folded, once per call.
func (b *Bound) Admit(name string) bool {
	if len(name) > b.maxBytes {
		b.folded.Add(1)
		return false
	}
	if _, ok := b.seen.Load(name); ok {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen.Load(name); ok {
		return true
	}
	if b.n >= b.max {
		b.folded.Add(1)
		return false
	}
	// A copy: name may point into a request's buffer.
	b.seen.Store(strings.Clone(name), struct{}{})
	b.n++
	return true
}

// Folded is how many times a name was refused.
func (b *Bound) Folded() uint64 { return b.folded.Load() }

// Limits returns the bound's count and length of names.
func (b *Bound) Limits() (max, maxBytes int) { return b.max, b.maxBytes }
