package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// mapping calls f for each key of m, rejecting unknown and repeated keys.
func (b *builder) mapping(m *yaml.Node, allowed []string, f func(k string, key, value *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], deref(m.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			b.errorf(k, "a key must be a string, found %s", kindName(k))
			continue
		}
		if !slices.Contains(allowed, k.Value) {
			hint := ""
			if s := closest(k.Value, allowed); s != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", s)
			}
			b.errorf(k, "unknown key %q%s; allowed here: %s", k.Value, hint, strings.Join(allowed, ", "))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			b.errorf(k, "key %q repeated (first at line %d)", k.Value, line)
			continue
		}
		seen[k.Value] = k.Line
		f(k.Value, k, v)
	}
}

func (b *builder) str(v *yaml.Node) (string, bool) {
	if v.Kind != yaml.ScalarNode {
		b.errorf(v, "want a string, found %s", kindName(v))
		return "", false
	}
	if v.Tag == "!!null" {
		return "", true
	}
	if len(v.Value) > b.limits.MaxValueLen {
		b.errorf(v, "%d bytes, more than the limit of %d for a domain, key, value or name", len(v.Value), b.limits.MaxValueLen)
		return "", false
	}
	return v.Value, true
}

// deref returns what an alias names, and any other node as it is. The
// walk through aliases is bounded by checkExpansion, which runs first.
func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

func (b *builder) boolean(v *yaml.Node) bool {
	var x bool
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&x) != nil {
		b.errorf(v, "want true or false, found %s", describe(v))
	}
	return x
}

func (b *builder) uint(v *yaml.Node, max uint64) (uint64, bool) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!int" {
		x, err := strconv.ParseUint(strings.ReplaceAll(v.Value, "_", ""), 0, 64)
		if err == nil && x <= max {
			return x, true
		}
	}
	b.errorf(v, "want a whole number from 0 to %d, found %s", max, describe(v))
	return 0, false
}

func (b *builder) failureMode(v *yaml.Node) FailureMode {
	s, ok := b.str(v)
	if !ok {
		return FailDefault
	}
	switch s {
	case "open":
		return FailOpen
	case "closed":
		return FailClosed
	}
	b.errorf(v, "failure_mode must be open or closed, found %q", s)
	return FailDefault
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return describe(n)
}

func describe(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return kindName(n)
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return strconv.Quote(n.Value)
}

// closest returns the allowed key nearest to k by edit distance, when it is
// close enough to be a likely typo.
func closest(k string, allowed []string) string {
	best, bestD := "", 4
	for _, a := range allowed {
		if d := distance(k, a); d < bestD {
			best, bestD = a, d
		}
	}
	return best
}

func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
