// Package enforce holds what every tollgate door means by a rule: named
// limits (Policy), what a rule does when the store fails (FailureMode), the
// default deadline and log pace, and the doors' options (Option). httplimit
// (net/http middleware), grpclimit (gRPC interceptors) and the rules files
// of tollgate serve all use these, so a rule means the same thing at every
// door, and one list of Options configures an HTTP and a gRPC limiter
// alike:
//
//	opts := []enforce.Option{enforce.WithClientIP(ips), enforce.WithRegistry(reg)}
//	web, err := httplimit.New(store, webRules, opts...)
//	api, err := grpclimit.New(store, apiRules, opts...)
//
// # The model
//
// A rule has a name, a FailureMode and a dry-run flag. For each request it
// applies to, it builds a key (namespaced by rule and key kind, so rules
// and tenants never share a counter), picks the Policies — named limits —
// that apply, and a cost. It checks the policies in order and spends the
// cost on each that admits it; it stops at the first that denies, so a
// request denied by a per-second burst does not also eat into a daily
// quota. Put short windows first. The tightest policy decides and is
// reported (see headers.Binding). Every rule that matches a request
// applies, in order, and the first that blocks stops the rest.
//
// When the store fails or misses the deadline (DefaultTimeout unless the
// door's WithTimeout says otherwise), a FailOpen rule lets the request
// through and a FailClosed rule rejects it; either way the event is
// counted, and logged at most once per log interval (DefaultLogInterval)
// with the number of events left out since (similar_events_not_logged), so
// a Redis outage produces one line every few seconds, not one per request.
// A dry-run rule decides and reports like any other but never blocks: its
// denials are counted as dry_run_denied.
package enforce

import (
	"fmt"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// DefaultTimeout bounds each request's store calls when no WithTimeout is
// given (50 ms): long enough for a Redis round trip under load, short
// enough that a hung Redis cannot hold requests. Requests starting within
// 1/8 of it (at most 1 ms) share one timer, so each gets between 50 and
// 51 ms.
const DefaultTimeout = 50 * time.Millisecond

// DefaultLogInterval is how often, at most, store failures are logged when
// no WithLogInterval is given: one record per 10 s keeps an outage visible
// without flooding the log. Every door (httplimit, grpclimit, the decision
// service and its Redis client's own lines) uses the same.
const DefaultLogInterval = 10 * time.Second

// Policy is a named limit: the name is what clients see in RateLimit-Policy
// and RateLimit, and what a 429 body says was violated. Name is 1 to 64
// printable ASCII characters without spaces, ':', '"' or '\'; two policies
// of one rule must differ in algorithm or period, or they would share one
// counter.
type Policy struct {
	Name  string
	Limit tollgate.Limit
	// Rollout, when not nil, is a new limit on its way in for this policy:
	// for a share of the keys, from an instant, announced until then.
	Rollout *Rollout
	// Penalty, when not nil, keeps a key that trips the policy out for a
	// while.
	Penalty *Penalty
}

// FailureMode says what a rule does when the store cannot decide. It is the
// one failure mode of every door: httplimit and grpclimit rules, and the
// rules files of the decision service.
type FailureMode uint8

const (
	// FailDefault, the zero value, defers to the default of whoever applies
	// the rule: httplimit and grpclimit fail open; the decision service
	// applies its --failure-mode, and a rule in its rules file without
	// failure_mode has this one.
	FailDefault FailureMode = iota
	// FailOpen lets the request through: the usual choice for read-heavy
	// endpoints, where an outage of the limiter must not take the API down.
	FailOpen
	// FailClosed rejects the request (HTTP 503, gRPC UNAVAILABLE, the
	// service's OVER_LIMIT): for login, payments and anything where
	// unlimited traffic is the bigger risk.
	FailClosed
)

// String returns "fail_open", "fail_closed" or "default".
func (m FailureMode) String() string {
	switch m {
	case FailDefault:
		return "default"
	case FailOpen:
		return "fail_open"
	case FailClosed:
		return "fail_closed"
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m))
}

// ParseFailureMode reads "fail_open" or "fail_closed" (also "open",
// "closed", with - or _, in any case), as FailureMode.String writes them.
func ParseFailureMode(s string) (FailureMode, error) {
	switch strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_") {
	case "fail_open", "open":
		return FailOpen, nil
	case "fail_closed", "closed":
		return FailClosed, nil
	}
	return FailDefault, fmt.Errorf("enforce: unknown failure mode %q (want fail_open or fail_closed)", s)
}

// Penalty keeps a key out for a fixed time once it trips its policy: a
// login endpoint's "5 failed tries, then 15 minutes out", which no bucket
// can say. The penalty starts with the After-th denial of the key within
// Within (the first denial when After is 0 or 1); until For has passed,
// every request of the key is denied without spending the policy, its
// Retry-After running to the penalty's end. A denial during the penalty
// neither extends it nor counts towards the next one. Each door counts the
// penalties it starts (tollgate_<door>_penalties_total).
//
// The penalty and the denials that start it are states of their own in
// the store, beside the policy's (a token bucket of one per For, a sliding
// log of After-1 per Within), so they are as exact, and as shared between
// replicas, as the policy: a rule with a penalty costs one more store call
// per request, and two more for a denial.
type Penalty struct {
	For    time.Duration
	After  int
	Within time.Duration
}
