package config

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"google.golang.org/protobuf/types/known/structpb"
)

// Unit is the time unit of an envoy rate limit. Its values are those of
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit, so a server
// can convert it with a plain cast.
type Unit int32

// The units envoyproxy/ratelimit accepts. A month is 30 days and a year 365,
// as there.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = map[string]Unit{
	"second": Second, "minute": Minute, "hour": Hour, "day": Day,
	"week": Week, "month": Month, "year": Year,
}

// ParseUnit returns the unit named s, in any case ("minute", "MINUTE").
func ParseUnit(s string) (Unit, error) {
	if u, ok := unitNames[strings.ToLower(s)]; ok {
		return u, nil
	}
	return UnitUnknown, fmt.Errorf("config: unknown unit %q (want second, minute, hour, day, week, month or year)", s)
}

// Duration returns the length of the unit.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// String returns the unit's name in lower case, as files spell it.
func (u Unit) String() string {
	for name, v := range unitNames {
		if v == u {
			return name
		}
	}
	return "unknown"
}

// FailureMode says what a rule answers when the store fails or misses its
// deadline: enforce's, the one failure mode of every door.
type FailureMode = enforce.FailureMode

const (
	// FailDefault defers to the server's setting.
	FailDefault = enforce.FailDefault
	// FailOpen answers OK: traffic flows unlimited while the store is away.
	FailOpen = enforce.FailOpen
	// FailClosed answers OVER_LIMIT: nothing passes while the store is away.
	FailClosed = enforce.FailClosed
)

// Rule is one rate_limit of a file, as a server applies it. Rules are
// immutable once loaded and shared by every request.
type Rule struct {
	// Domain is the domain the rule belongs to.
	Domain string
	// ID names the rule as envoyproxy/ratelimit names its statistics: the
	// domain and the path of the descriptor, such as
	// "edge.remote_address" or "messaging.message_type_marketing.to_number".
	ID string
	// Name is rate_limit.name, the name other rules' replaces refer to.
	Name string
	// Replaces lists the names of the rules this one drops from a request
	// when both apply.
	Replaces []string
	// Unit and RequestsPerUnit are the envoy limit as written.
	Unit            Unit
	RequestsPerUnit uint32
	// Unlimited rules answer OK without touching the store.
	Unlimited bool
	// Limit is what the store decides with: RequestsPerUnit per Unit, with
	// the rule's algorithm and burst. Zero when Unlimited; its Rate is 0
	// (so it is no valid limit for a store) when the rule denies every
	// request.
	Limit tollgate.Limit
	// Cost is how much one hit spends (at least 1).
	Cost int
	// Rollout, when not nil, is a new limit on its way in for a share of
	// the rule's keys (a rollout in the rules file); Rolled is the rule as
	// it decides the keys the rollout applies to: the same rule, with the
	// rollout's RequestsPerUnit and Limit, and no Rollout of its own.
	Rollout *enforce.Rollout
	Rolled  *Rule
	// Penalty, when not nil, keeps a counter that trips the rule out for a
	// while (a penalty in the rules file; see enforce.Penalty).
	Penalty *enforce.Penalty
	// Concurrency, when not nil, makes the rule a concurrency limit: at
	// most Concurrency.Max requests of a counter in flight at once,
	// instead of a rate. Unit, RequestsPerUnit and Limit are then zero.
	Concurrency *Concurrency
	// Set, when not nil, makes the rule a plan of several limits
	// (rate_limits in the rules file): 2 to MaxSetLimits of them, in file
	// order, that a request spends together, all or nothing, from the
	// descriptor's one counter key. Unit, RequestsPerUnit and Limit are
	// then zero, and Rollout nil; Cost and FailureMode are the set's, and
	// Penalty, when not nil, trips on the denials of Set[PenaltyLimit].
	Set []SetLimit
	// PenaltyLimit is the index in Set of the limit whose denials count
	// towards Penalty; 0 for a rule of one limit.
	PenaltyLimit int
	// FailureMode decides when the store fails.
	FailureMode FailureMode
	// DryRun rules (shadow_mode in the rules file) decide and count but
	// always answer OK, so that a new limit can be watched before it is
	// enforced.
	DryRun bool
	// QuotaMode rules make a request OVER_LIMIT only when every quota rule
	// of the request is over its limit.
	QuotaMode bool
	// DetailedMetric rules report metrics under the request's values rather
	// than under ID.
	DetailedMetric bool
	// Metadata is the descriptor's metadata (metadata.go), nil when it
	// has none: the server returns it in the dynamic metadata of answers
	// the rule passes. It is shared by every answer: read, never changed.
	Metadata *structpb.Struct
	// File and Line locate the rule's descriptor.
	File string
	Line int

	// Index is the rule's position in Rules.All: servers use it to keep
	// per-rule state in a slice.
	Index int

	// depth is the number of entries a request needs to reach the rule.
	depth int
	// shared[i], when not empty, replaces the value of the request's entry
	// i in the counter's key: a share_threshold wildcard, so that every
	// value it matches spends one counter.
	shared []string
	// valueToMetric[i] says that metrics show the request's value of entry
	// i (value_to_metric).
	valueToMetric []bool
	// steps[i] is the part of ID for entry i: "key" or "key_value".
	steps []string
	// override marks the rule of a request's own limit (OverrideRule).
	override bool
	// rolledPerUnit is the rollout's requests_per_unit, for Rolled.
	rolledPerUnit uint32
	// setLimits are the Limits of Set, in its order (SetLimits).
	setLimits []tollgate.Limit
}

// MaxSetLimits is the most limits one descriptor's rate_limits may hold:
// the most a store decides together (tollgate.Combiner).
const MaxSetLimits = 16

// SetLimit is one limit of a rule with several (Rule.Set): one mapping of
// a descriptor's rate_limits list.
type SetLimit struct {
	// ID names the limit's statistics and, unless it has a Name, its
	// RateLimit-Policy item: the rule's ID, '.', and Step, such as
	// "api.plan_free.second". envoyproxy/ratelimit names a limit's
	// statistics after the path to it (config_impl.go's FullKey); a set
	// adds one more step to that path, so that each limit keeps its own
	// total_hits, over_limit and near_limit, as it would on a descriptor
	// of its own.
	ID string
	// Step is the limit's part of ID: its name when it has one, else its
	// unit ("second", "day").
	Step string
	// Name is the limit's name, "" when it has none: it names its
	// RateLimit-Policy item and current_limit, and another rule's
	// replaces that names it drops the whole set.
	Name string
	// Unit and RequestsPerUnit are the limit as written (RequestsPerUnit
	// at least 1).
	Unit            Unit
	RequestsPerUnit uint32
	// Limit is what the store decides with.
	Limit tollgate.Limit
	// Line and Column locate the limit's mapping.
	Line, Column int
}

// SetLimits returns the Limits of r.Set in its order, nil for a rule of
// one limit. The slice is shared by every caller: read it, never change
// it.
func (r *Rule) SetLimits() []tollgate.Limit { return r.setLimits }

// Named reports whether name is r's name or the name of one of its
// limits: whether a replaces naming it drops r.
func (r *Rule) Named(name string) bool {
	if name == "" {
		return false
	}
	if r.Name == name {
		return true
	}
	for i := range r.Set {
		if r.Set[i].Name == name {
			return true
		}
	}
	return false
}

// OverrideRule returns the rule of a descriptor that carries its own limit
// (RateLimitDescriptor.limit, which Envoy sends when a route's rate limit
// action sets one): requestsPerUnit per unit, or per unitMultiplier units
// when that is more than 1, counted with a fixed window as
// envoyproxy/ratelimit counts, never a dry run. envoyproxy/ratelimit
// applies it whatever the files say for the descriptor, as long as the
// domain is known.
//
// Its ID is domain + ".override"; MetricID names each request as
// envoyproxy/ratelimit names the statistics of such a limit:
// "domain.key_value.key_value", the key alone for an empty value. A unit
// it does not know (UnitUnknown) gives a rule with no Limit, marked
// Unlimited, that a server should refuse rather than apply. The rule is
// not one of any Rules: its Index is -1.
func OverrideRule(domain string, unit Unit, requestsPerUnit, unitMultiplier uint32) *Rule {
	period := unit.Duration()
	if m := time.Duration(unitMultiplier); m > 1 {
		// Past what a Duration holds, the period is refused by
		// Limit.Validate rather than wrapped around to a short one.
		if period > math.MaxInt64/m {
			period = math.MaxInt64
		} else {
			period *= m
		}
	}
	r := &Rule{Domain: domain, ID: domain + ".override", Unit: unit, RequestsPerUnit: requestsPerUnit,
		Cost: 1, Index: -1, override: true}
	if period == 0 {
		r.Unlimited = true
		return r
	}
	r.Limit = tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: int(requestsPerUnit), Period: period}
	return r
}

// MetricID returns the name metrics report a request under, as
// envoyproxy/ratelimit names the statistics of a rule:
//   - ID, for most rules;
//   - with value_to_metric, ID with the request's value in place of the
//     file's at each entry so marked ("key" becomes "key_value");
//   - with detailed_metric, every entry as the request's "key_value",
//     joined by '_' even when the value is empty ("key_"), except that an
//     entry matched by a share_threshold wildcard shows the pattern
//     ("key_files/*"), so that the values sharing one counter share one
//     name too;
//   - for a request's own limit (OverrideRule), every entry as "key_value",
//     or "key" when the value is empty.
//
// A name that depends on the request gives a metric series per value:
// mind the cardinality. MetricID allocates only for those rules.
func MetricID[E Entry](r *Rule, entries []E) string {
	if !r.HasValueToMetric() || (!r.override && len(entries) != len(r.steps)) {
		return r.ID
	}
	n := len(r.Domain)
	for _, e := range entries {
		n += 2 + len(e.GetKey()) + len(e.GetValue())
	}
	for _, s := range r.shared {
		n += len(s)
	}
	b := make([]byte, 0, n)
	b = append(b, r.Domain...)
	for i, e := range entries {
		b = append(b, '.')
		key, value := e.GetKey(), e.GetValue()
		switch shared, isShared := r.SharedValue(i); {
		case r.override:
			b = appendStep(b, key, value, false)
		case r.DetailedMetric && isShared:
			b = appendStep(b, key, shared, false)
		case r.DetailedMetric:
			// envoy joins the two whatever the value.
			b = appendStep(b, key, value, true)
		case r.ValueToMetric(i):
			b = appendStep(b, key, value, false)
		default:
			b = append(b, r.steps[i]...)
		}
	}
	return string(b)
}

// appendStep appends "key_value" to b, or "key" when value is empty and
// not always.
func appendStep(b []byte, key, value string, always bool) []byte {
	b = append(b, key...)
	if value != "" || always {
		b = append(b, '_')
		b = append(b, value...)
	}
	return b
}

// DenyAll reports whether the rule denies every request that spends
// something (requests_per_unit: 0).
func (r *Rule) DenyAll() bool {
	return !r.Unlimited && r.Concurrency == nil && r.Set == nil && r.RequestsPerUnit == 0
}

// Concurrency is a concurrency rule's limit, as a file's concurrency
// mapping writes it:
//
//	descriptors:
//	- key: tenant
//	  concurrency:
//	    max_in_flight: 5   # requests of one tenant in flight at once
//	    lease: 5m          # how long a slot stays taken if its release never comes
//
// A request takes a slot when it starts and gives it back when it ends; a
// slot whose release is lost (a gateway that crashed, a call that never
// arrived) is given back when its lease ends. The lease is the longest a
// lost release can keep a slot, and should be longer than the longest
// request: one still running when its lease ends no longer counts.
type Concurrency struct {
	// Max is how many requests may hold a slot at once: 1 to
	// tollgate.MaxConcurrency.
	Max int
	// Lease is how long a slot is held unless released first:
	// tollgate.MinLease to tollgate.MaxLease.
	Lease time.Duration
}

// SharedValue returns the value that replaces the request's entry i in the
// counter's key, and whether there is one (share_threshold).
func (r *Rule) SharedValue(i int) (string, bool) {
	if i < len(r.shared) && r.shared[i] != "" {
		return r.shared[i], true
	}
	return "", false
}

// HasSharedValues reports whether any entry's value is replaced in the
// counter's key.
func (r *Rule) HasSharedValues() bool { return len(r.shared) > 0 }

// ValueToMetric reports whether metrics show the request's value of entry
// i (value_to_metric). DetailedMetric shows every value.
func (r *Rule) ValueToMetric(i int) bool {
	return r.DetailedMetric || (i < len(r.valueToMetric) && r.valueToMetric[i])
}

// HasValueToMetric reports whether the name metrics report a request
// under depends on the request (see MetricID): any entry's value shows in
// it, or the rule is a request's own limit.
func (r *Rule) HasValueToMetric() bool {
	return r.DetailedMetric || len(r.valueToMetric) > 0 || r.override
}

// Entry is what Lookup needs of a request's descriptor entry. The generated
// *envoy.extensions.common.ratelimit.v3.RateLimitDescriptor_Entry satisfies
// it, so a server matches protobuf requests without copying them.
type Entry interface {
	GetKey() string
	GetValue() string
}

// KV is a plain Entry.
type KV struct{ Key, Value string }

// GetKey returns kv.Key.
func (kv KV) GetKey() string { return kv.Key }

// GetValue returns kv.Value.
func (kv KV) GetValue() string { return kv.Value }

// Rules is a loaded, validated set of domains. It is immutable: a reload
// builds a new one and swaps it in.
type Rules struct {
	domains map[string]*node
	all     []*Rule
	files   []string
	// sources are the contents that were loaded, by file: a reload whose
	// files have not changed can be skipped.
	sources map[string]string
}

// node is one descriptor of the tree.
type node struct {
	exact map[kv]*node // children with a value, by key and value
	bare  map[string]*node
	wild  []wildcard // children whose value has a '*', in file order
	rule  *Rule
}

type kv struct{ key, value string }

type wildcard struct {
	key   string
	parts []string // the pattern split at '*'
	node  *node
}

func (n *node) hasChildren() bool {
	return len(n.exact) > 0 || len(n.bare) > 0 || len(n.wild) > 0
}

// Lookup returns the rule that applies to a descriptor of domain, or nil
// when none does (see the package documentation for the matching order).
// It allocates nothing.
func Lookup[E Entry](r *Rules, domain string, entries []E) *Rule {
	if r == nil || len(entries) == 0 {
		return nil
	}
	n := r.domains[domain]
	if n == nil {
		return nil
	}
	for i, e := range entries {
		key, value := e.GetKey(), e.GetValue()
		next := n.exact[kv{key, value}]
		if next == nil {
			for _, w := range n.wild {
				if w.key == key && wildcardMatch(w.parts, value) {
					next = w.node
					break
				}
			}
		}
		if next == nil {
			next = n.bare[key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			return next.rule
		}
		if !next.hasChildren() {
			return nil
		}
		n = next
	}
	return nil
}

// HasDomain reports whether domain is configured.
func (r *Rules) HasDomain(domain string) bool {
	_, ok := r.domains[domain]
	return ok
}

// Domains returns the number of domains.
func (r *Rules) Domains() int { return len(r.domains) }

// DomainNames returns the names of the domains, sorted.
func (r *Rules) DomainNames() []string {
	names := make([]string, 0, len(r.domains))
	for d := range r.domains {
		names = append(names, d)
	}
	slices.Sort(names)
	return names
}

// All returns every rule, in file order; Rule.Index is the position here.
func (r *Rules) All() []*Rule { return r.all }

// Files returns the files the rules were loaded from.
func (r *Rules) Files() []string { return r.files }

// Same reports whether o was loaded from exactly the same files with the
// same contents, so that swapping it in would change nothing.
func (r *Rules) Same(o *Rules) bool {
	if r == nil || o == nil || len(r.sources) != len(o.sources) {
		return false
	}
	for f, s := range r.sources {
		if t, ok := o.sources[f]; !ok || s != t {
			return false
		}
	}
	return true
}

// wildcardMatch reports whether value matches a pattern split at its '*'s:
// it starts with the first part, ends with the last, and holds the middle
// parts in order between them, without overlapping.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
