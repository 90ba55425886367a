package config

import (
	"bufio"
	"cmp"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Dump writes the rules as envoyproxy/ratelimit's debug endpoint /rlconfig
// shows its configuration, one line per rate_limit:
//
//	domain.key_value.key: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false
//
// The name is the rule's ID; the unit is in upper case, and UNKNOWN for an
// unlimited rule. tollgate's own keys (algorithm, burst, cost,
// failure_mode) are not shown, so that tools reading envoy's output read
// this one. envoyproxy/ratelimit writes its lines in Go's map order, which
// changes from one call to the next; Dump writes them in a fixed one that
// keeps envoy's shape: domains by name, and in each a descriptor's line
// before the lines of the descriptors under it, siblings sorted by
// "key" or "key_value" (the order of their bytes). Descriptors without a
// rate_limit have no line of their own. A concurrency rule, which envoy
// has no form for, shows its limit instead of a unit:
//
//	domain.tenant: concurrency max_in_flight=5 lease=5m0s, shadow_mode: false, quota_mode: false
//
// A descriptor with several limits (rate_limits) has a line per limit, in
// the list's order, each under the limit's statistics name
// (SetLimit.ID) and ending with the descriptor's, which the limits of the
// set share:
//
//	api.plan_free.second: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false, set: api.plan_free
//	api.plan_free.day: unit=DAY requests_per_unit=100, shadow_mode: false, quota_mode: false, set: api.plan_free
//
// A nil Rules writes nothing.
func (r *Rules) Dump(w io.Writer) error {
	if r == nil {
		return nil
	}
	bw := bufio.NewWriter(w)
	for _, d := range r.DomainNames() {
		dumpNode(bw, r.domains[d])
	}
	return bw.Flush()
}

// child is a node of the tree with the step that reaches it.
type child struct {
	step string
	kv   kv
	n    *node
}

// dumpNode writes the lines of the descriptors under n, depth first.
// Errors are the writer's, which Flush reports.
func dumpNode(w *bufio.Writer, n *node) {
	children := make([]child, 0, len(n.exact)+len(n.bare))
	for k, c := range n.exact {
		children = append(children, child{k.key + "_" + k.value, k, c})
	}
	for k, c := range n.bare {
		children = append(children, child{k, kv{key: k}, c})
	}
	// Two nodes can share a step (key "a" value "b_c", key "a_b" value
	// "c"); the key breaks the tie.
	slices.SortFunc(children, func(a, b child) int {
		return cmp.Or(strings.Compare(a.step, b.step), strings.Compare(a.kv.key, b.kv.key))
	})
	var buf []byte
	for _, c := range children {
		r := c.n.rule
		switch {
		case r == nil:
		case r.Set != nil:
			for i := range r.Set {
				buf = appendSetLine(buf[:0], r, &r.Set[i])
				w.Write(buf)
			}
		default:
			buf = appendDumpLine(buf[:0], r)
			w.Write(buf)
		}
		dumpNode(w, c.n)
	}
}

// appendDumpLine appends the line of r, as envoyproxy/ratelimit's
// rateLimitDescriptor.dump formats it.
func appendDumpLine(b []byte, r *Rule) []byte {
	b = append(b, r.ID...)
	if c := r.Concurrency; c != nil {
		// No envoy form to keep: a concurrency rule is tollgate's own.
		b = append(b, ": concurrency max_in_flight="...)
		b = strconv.AppendInt(b, int64(c.Max), 10)
		b = append(b, " lease="...)
		b = append(b, c.Lease.String()...)
	} else {
		b = appendUnit(b, r.Unit, r.RequestsPerUnit)
	}
	b = appendModes(b, r)
	return append(b, '\n')
}

// appendSetLine appends the line of l, a limit of r's set.
func appendSetLine(b []byte, r *Rule, l *SetLimit) []byte {
	b = append(b, l.ID...)
	b = appendUnit(b, l.Unit, l.RequestsPerUnit)
	b = appendModes(b, r)
	b = append(b, ", set: "...)
	b = append(b, r.ID...)
	return append(b, '\n')
}

func appendUnit(b []byte, u Unit, requestsPerUnit uint32) []byte {
	b = append(b, ": unit="...)
	b = append(b, strings.ToUpper(u.String())...)
	b = append(b, " requests_per_unit="...)
	return strconv.AppendUint(b, uint64(requestsPerUnit), 10)
}

func appendModes(b []byte, r *Rule) []byte {
	b = append(b, ", shadow_mode: "...)
	b = strconv.AppendBool(b, r.DryRun)
	b = append(b, ", quota_mode: "...)
	return strconv.AppendBool(b, r.QuotaMode)
}
