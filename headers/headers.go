// Package headers writes rate-limit decisions into HTTP response headers, in
// the flavours clients understand: the IETF draft fields RateLimit-Policy and
// RateLimit (draft-ietf-httpapi-ratelimit-headers-09 and later), the
// RateLimit-Limit/-Remaining/-Reset fields of the earlier drafts, GitHub's
// X-RateLimit-Limit/-Remaining/-Reset, and Retry-After.
//
// It depends on nothing but tollgate.Result, so the middleware (httplimit),
// the decision service and anything else that decides can share it: decide,
// collect one Decision per named limit (a policy), call Write.
//
// # What the numbers mean
//
// For a policy whose Limit is Rate per Period:
//
//   - RateLimit-Policy: "name";q=Rate;w=Period in seconds. A period that is
//     not a whole number of seconds is rounded up and q scaled down to match
//     (never more than the limit admits): 5 per 500ms is q=10;w=1. Bucket
//     algorithms whose Burst differs from Rate add tollgate-burst=Burst.
//   - RateLimit: "name";r=Remaining;t=seconds. When the policy denied the
//     request, t is its RetryAfter rounded up: the first moment the same
//     request can pass. Otherwise t is its ResetAfter rounded up: when the
//     full allowance is back. Either way, sending no more than r within t
//     seconds never gets a 429 from this policy.
//   - RateLimit-Reset (seconds from now) and X-RateLimit-Reset (a Unix time,
//     as GitHub sends it) carry the same instant as t. RateLimit-Limit and
//     X-RateLimit-Limit carry the most Remaining can be: Burst for the bucket
//     algorithms, q for the window ones.
//   - Retry-After: whole seconds, rounded up, at least 1, set only when a
//     binding decision denied the request. Rounding down would bring the
//     client back a fraction of a second early, to a second 429.
//
// The draft fields list every decision. The older flavours hold one number
// each, so they report the binding decision (see Binding): the denial with
// the longest wait, or, when everything was allowed, the policy closest to
// running out.
//
// A dry-run decision (a limit being tried out, which never blocks) appears in
// the draft fields with the boolean parameter tollgate-dry-run, and is never
// binding: it sets neither Retry-After nor the single-value flavours.
//
// An announced limit (one that starts applying later, Decision.From) is an
// extra item of RateLimit-Policy with the Integer parameter tollgate-from,
// the instant it applies from in Unix seconds: "api";q=100;w=60,
// "api:next";q=60;w=60;tollgate-from=1798761600. Clients that do not know
// the parameter ignore it, as the draft requires of unknown parameters.
package headers

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/headerfmt"
)

// maxFieldsPerWrite is how many fields Write sets at most: two draft
// fields, three and three older ones, Retry-After.
const maxFieldsPerWrite = headerfmt.MaxFields

// Flavor selects which header fields Write sets. Flavors combine with |.
// Retry-After is written whatever the flavour.
type Flavor uint8

const (
	// Draft is the IETF draft's RateLimit-Policy and RateLimit: structured
	// field lists with one item per policy.
	Draft Flavor = 1 << iota
	// RateLimitFields is RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (seconds from now), as the drafts up to -07 defined
	// them and many gateways still send them.
	RateLimitFields
	// XRateLimit is X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (a Unix time in seconds), as GitHub sends them.
	XRateLimit

	// allFlavors is every flavour.
	allFlavors = Draft | RateLimitFields | XRateLimit
)

var flavorNames = []struct {
	f    Flavor
	name string
}{{Draft, "draft"}, {RateLimitFields, "ratelimit"}, {XRateLimit, "x-ratelimit"}}

// String returns the flavours' names joined by commas, as ParseFlavor reads
// them: "draft", "ratelimit", "x-ratelimit".
func (f Flavor) String() string {
	var names []string
	for _, n := range flavorNames {
		if f&n.f != 0 {
			names = append(names, n.name)
		}
	}
	if rest := f &^ allFlavors; rest != 0 {
		names = append(names, "Flavor("+strconv.Itoa(int(rest))+")")
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ParseFlavor reads a comma-separated list of flavour names ("draft",
// "ratelimit", "x-ratelimit"; "all" for every one; "none" for none), as a
// configuration file would spell them.
func ParseFlavor(s string) (Flavor, error) {
	var f Flavor
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(strings.ToLower(part))
		switch part {
		case "all":
			f |= allFlavors
			continue
		case "none":
			continue
		}
		found := false
		for _, n := range flavorNames {
			if part == n.name {
				f |= n.f
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("headers: unknown flavour %q (want draft, ratelimit, x-ratelimit, all or none)", part)
		}
	}
	return f, nil
}

// Decision is one policy's outcome for a request: its name, as the client
// sees it in RateLimit-Policy and RateLimit, and the store's Result.
type Decision struct {
	// Policy names the limit. It is written as a structured-field String:
	// printable ASCII; any other byte is written as '_'.
	Policy string
	// Result is what the store decided; Result.Limit is the policy's limit.
	Result tollgate.Result
	// DryRun marks a limit that is being tried out: it is reported with the
	// tollgate-dry-run parameter, but never binding, so it never brings a
	// Retry-After or the single-value flavours.
	DryRun bool
	// From, when not zero, makes the decision an announcement: a limit that
	// starts applying at From (see enforce.Rollout). Result.Limit is that
	// limit; the rest of Result is unused. It is listed in RateLimit-Policy
	// only, with the Integer parameter tollgate-from, From in Unix seconds
	// (rounded down), and is never binding.
	From time.Time
	// PolicyOnly lists the decision in RateLimit-Policy only, never
	// binding: a limit the request was checked against that another
	// decision of the response stands for in RateLimit and the
	// single-value flavours, such as a limit of a set decided together
	// (tollgate.Combiner) that was not the one that decided.
	PolicyOnly bool
}

// Binding returns the index of the decision that decides the request and
// is reported in the single-value flavours, or -1 when there is none (no
// decisions, or only dry-run ones, announcements and PolicyOnly ones). Among denials it is the one with the
// longest RetryAfter; when every binding decision allowed the request, the
// one with the least Remaining, and among those the longest ResetAfter.
func Binding(ds []Decision) int { return headerfmt.Binding(fmtDecisions(ds)) }

// fmtDecisions is ds as headerfmt's Decisions, which are field for field
// the same: the conversion below compiles only while they are.
func fmtDecisions(ds []Decision) []headerfmt.Decision {
	return unsafe.Slice((*headerfmt.Decision)(unsafe.Pointer(unsafe.SliceData(ds))), len(ds))
}

var _ = headerfmt.Decision(Decision{})

// RetryAfterSeconds returns the Retry-After value for a denial that may be
// retried after d: d rounded up to whole seconds, but at least 1, because
// "Retry-After: 0" tells a denied client to come straight back.
func RetryAfterSeconds(d time.Duration) int64 { return headerfmt.RetryAfterSeconds(d) }

// SetRetryAfter sets Retry-After in h to RetryAfterSeconds(d).
func SetRetryAfter(h http.Header, d time.Duration) {
	h["Retry-After"] = []string{strconv.FormatInt(RetryAfterSeconds(d), 10)}
}

// Write sets the fields of flavour f in h from ds (one Decision per policy
// that applied to the request), replacing any values they had, and sets
// Retry-After when a binding decision denied the request. now is the
// current time, used only for X-RateLimit-Reset. With no decisions, or only
// dry-run ones for the single-value flavours, those fields are left alone.
//
// Write allocates twice however many fields it sets (one string holding
// every value, one array backing every field's slice), so it is cheap
// enough for every response; Values.Write saves the second. The slices it
// stores in h have no spare capacity: adding a value to a field copies it
// first.
func Write(h http.Header, f Flavor, now time.Time, ds ...Decision) {
	headerfmt.Write(h, headerfmt.Flavor(f), now, nil, nil, "", fmtDecisions(ds))
}

// Values is room for the slices Write stores in a header: one per field,
// for every flavour and Retry-After. A caller that already has memory of
// its own for each response (a middleware's per-request state) can keep
// a Values in it, so that writing the headers allocates only the string
// holding their values.
type Values [maxFieldsPerWrite]string

// Write is the package's Write, with the fields' slices in v instead of a
// new array. h keeps them: v serves one header, and must not be reused
// while h is in use.
func (v *Values) Write(h http.Header, f Flavor, now time.Time, ds ...Decision) {
	headerfmt.Write(h, headerfmt.Flavor(f), now, v[:], nil, "", fmtDecisions(ds))
}
