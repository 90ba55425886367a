package config

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Warning is a rule that loads and is applied as written, but is likely
// not what its author meant. WithWarnings says which are reported.
type Warning struct {
	File   string
	Line   int
	Column int
	Msg    string
}

// String formats w as "file:line:column: message", as Error does.
func (w Warning) String() string {
	return (&Error{File: w.File, Line: w.Line, Column: w.Column, Msg: w.Msg}).Error()
}

// The thresholds of the warnings about a rate, in requests a second for
// one counter.
const (
	// warnAbove: one Redis core decides 100,000 to 200,000 times a second
	// for every key together (see docs/operations.md), so a single
	// counter's limit above this is never reached.
	warnAbove = 100_000
	// warnBelow: less than one request a day.
	warnBelow = 1.0 / (24 * 60 * 60)
)

// maxShadowCompare bounds how many earlier wildcards of one key, at one
// level, each wildcard is compared with: a file of many thousands of
// patterns costs at most this many comparisons for each.
const maxShadowCompare = 256

// WithWarnings makes Load and Parse call report, in file order, for each
// rule that loads but is likely not what was meant (the rules load and
// apply as written either way; a file with errors still reports the
// warnings of its valid rules):
//
//   - a descriptor no request can reach: a wildcard value after an earlier
//     wildcard of the same key and level that matches every value it
//     matches (wildcards are tried in file order: "/api/*" before
//     "/api/v2/*" leaves the second only the value "/api/v2/*" itself),
//     and a key without a value beside a wildcard made only of '*', which
//     matches every value first;
//   - unlimited: true with a requests_per_unit, which is ignored;
//   - a rate above 100,000 requests a second for one counter (1000000 per
//     second, 10000000 per minute), more than one Redis core decides for
//     every key together, so no client reaches it;
//   - a rate above 0 and below one request a day (20 per month, 100 per
//     year);
//   - requests_per_unit: 0 where no descriptor on the path has a value,
//     which denies every request with those keys; a block list names the
//     values it blocks.
//
// A duplicate key (with the same value) at one level is an error, not a
// warning: envoyproxy/ratelimit refuses it too.
func WithWarnings(report func(Warning)) Option {
	return func(o *options) { o.warn = report }
}

func (b *builder) warnf(n *yaml.Node, format string, args ...any) {
	w := Warning{File: b.name, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		w.Line, w.Column = n.Line, n.Column
	}
	b.warn(w)
}

// rateWarnings reports what is suspicious in r, a rate_limit without
// errors whose descriptor path leads to it.
func (b *builder) rateWarnings(r *Rule, f *rateLimitFields, path []level) {
	at := f.rpuNode
	if r.Unlimited {
		if at != nil {
			b.warnf(at, "requests_per_unit %d is ignored: unlimited: true answers every request OK without counting; remove one of the two", r.RequestsPerUnit)
		}
		return
	}
	if r.Concurrency != nil || r.Unit.Duration() == 0 {
		return
	}
	perSecond := float64(r.RequestsPerUnit) / r.Unit.Duration().Seconds()
	switch {
	case perSecond > warnAbove:
		b.warnf(at, "%d per %s is more than %d requests a second for one counter: one Redis core decides about that many for every key together, so no client reaches it; was a longer unit meant?",
			r.RequestsPerUnit, r.Unit, warnAbove)
	case r.RequestsPerUnit > 0 && perSecond < warnBelow:
		b.warnf(at, "%d per %s is less than one request a day; was a shorter unit meant?", r.RequestsPerUnit, r.Unit)
	case r.RequestsPerUnit == 0:
		keys := make([]string, 0, len(path))
		for _, lv := range path {
			if lv.value {
				return // a block list: this value (or pattern) only
			}
			keys = append(keys, fmt.Sprintf("%q", lv.step))
		}
		what := "key " + keys[0] + ", whatever its value"
		if len(keys) > 1 {
			what = "keys " + strings.Join(keys, ", ") + ", whatever their values"
		}
		b.warnf(at, "requests_per_unit 0 denies every request with %s: a block list names the values it blocks (value: ...); was a number left out?", what)
	}
}

// shadowKey is one key at one level of the tree: the node its
// descriptors hang from, and the key.
type shadowKey struct {
	parent *node
	key    string
}

// shadowSeen is what the descriptors of one shadowKey read so far can
// shadow.
type shadowSeen struct {
	wilds    []seenWild // in file order, the first maxShadowCompare
	catchAll *seenWild  // the first wildcard made only of '*'
	bare     *seenAt    // the descriptor without a value
}

type seenWild struct {
	value string
	parts []string
	at    seenAt
}

// seenAt is where a descriptor was read.
type seenAt struct {
	file         string
	line, column int
	id           string
}

// shadowWarnings reports e, just added under parent as id, when a
// descriptor read before it leaves it unreachable, or when it leaves an
// earlier one so.
func (b *builder) shadowWarnings(parent *node, e *descriptor, id string) {
	if b.shadows == nil {
		b.shadows = map[shadowKey]*shadowSeen{}
	}
	k := shadowKey{parent, e.key}
	s := b.shadows[k]
	if s == nil {
		s = &shadowSeen{}
		b.shadows[k] = s
	}
	at := e.keyNode
	if e.value != "" {
		at = e.valueNode
	}
	here := seenAt{file: b.name, line: at.Line, column: at.Column, id: id}
	if e.value == "" {
		if s.catchAll != nil {
			b.warnf(at, "descriptor %s, without a value, is never reached: the wildcard %q (%s) matches every value first", id, s.catchAll.value, b.where(s.catchAll.at))
		}
		s.bare = &here
		return
	}
	if !strings.Contains(e.value, "*") {
		return // an exact value is tried before any wildcard
	}
	w := seenWild{value: e.value, parts: strings.Split(e.value, "*"), at: here}
	for _, prev := range s.wilds {
		if covers(prev.parts, e.value) {
			b.warnf(at, "value %q is shadowed by %q (%s): wildcards are tried in file order and that one matches every value this one does, so only a request whose value is %q itself reaches it",
				e.value, prev.value, b.where(prev.at), e.value)
			break
		}
	}
	if len(s.wilds) < maxShadowCompare {
		s.wilds = append(s.wilds, w)
	}
	if strings.Trim(e.value, "*") == "" && s.catchAll == nil {
		s.catchAll = &w
		if s.bare != nil {
			b.warn(Warning{File: s.bare.file, Line: s.bare.line, Column: s.bare.column,
				Msg: fmt.Sprintf("descriptor %s, without a value, is never reached: the wildcard %q (%s) matches every value first", s.bare.id, e.value, b.whereFrom(here, s.bare.file))})
		}
	}
}

// where names a place for a message about the file being read: "line 4",
// or "other.yaml:4" in another file.
func (b *builder) where(at seenAt) string { return b.whereFrom(at, b.name) }

func (b *builder) whereFrom(at seenAt, file string) string {
	if at.file == file {
		return fmt.Sprintf("line %d", at.line)
	}
	return fmt.Sprintf("%s:%d", at.file, at.line)
}

// covers reports whether the wildcard split into parts matches every value
// that pattern (another wildcard) matches. It does when it matches pattern
// with each '*' replaced by a byte that none of its own parts holds: such
// a byte can only be taken by one of its own '*', which would take any
// text as well. Without such a byte (a pattern holding all 256), it
// reports false.
func covers(parts []string, pattern string) bool {
	lit := strings.Join(parts, "")
	for c := 0; c < 256; c++ {
		if strings.IndexByte(lit, byte(c)) < 0 {
			return wildcardMatch(parts, strings.ReplaceAll(pattern, "*", string([]byte{byte(c)})))
		}
	}
	return false
}
