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
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Canonical names of the fields Write sets, as http.Header keys them.
const (
	policyField         = "Ratelimit-Policy" // RateLimit-Policy
	limitField          = "Ratelimit"        // RateLimit
	oldLimitField       = "Ratelimit-Limit"
	oldRemainingField   = "Ratelimit-Remaining"
	oldResetField       = "Ratelimit-Reset"
	xLimitField         = "X-Ratelimit-Limit"
	xRemainingField     = "X-Ratelimit-Remaining"
	xResetField         = "X-Ratelimit-Reset"
	retryAfterField     = "Retry-After"
	dryRunParam         = "tollgate-dry-run"
	burstParam          = "tollgate-burst"
	fromParam           = "tollgate-from"
	maxFieldsPerWrite   = 9 // two draft fields, three and three older ones, Retry-After
	stackBufferCapacity = 256
)

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
}

// Binding returns the index of the decision that decides the request and
// is reported in the single-value flavours, or -1 when there is none (no
// decisions, or only dry-run ones). Among denials it is the one with the
// longest RetryAfter; when every binding decision allowed the request, the
// one with the least Remaining, and among those the longest ResetAfter.
func Binding(ds []Decision) int {
	best := -1
	for i := range ds {
		d := &ds[i]
		if d.DryRun || !d.From.IsZero() {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &ds[best]
		switch {
		case !d.Result.Allowed && b.Result.Allowed:
			best = i
		case d.Result.Allowed != b.Result.Allowed:
		case !d.Result.Allowed:
			if d.Result.RetryAfter > b.Result.RetryAfter {
				best = i
			}
		case d.Result.Remaining < b.Result.Remaining,
			d.Result.Remaining == b.Result.Remaining && d.Result.ResetAfter > b.Result.ResetAfter:
			best = i
		}
	}
	return best
}

// seconds rounds d up to whole seconds, as Retry-After and the reset fields
// need: a client told to come back in ⌊d⌋ seconds comes back early and is
// denied again. It returns 0 for d ≤ 0.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfterSeconds returns the Retry-After value for a denial that may be
// retried after d: seconds(d), but at least 1, because "Retry-After: 0" tells
// a denied client to come straight back.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(1, seconds(d))
}

// SetRetryAfter sets Retry-After in h to RetryAfterSeconds(d).
func SetRetryAfter(h http.Header, d time.Duration) {
	h[retryAfterField] = []string{strconv.FormatInt(RetryAfterSeconds(d), 10)}
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
	write(h, f, now, nil, ds)
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
	write(h, f, now, v[:], ds)
}

// write is Write, with room for the fields' slices in vals (at least
// maxFieldsPerWrite of them), or in a new array when vals is nil.
func write(h http.Header, f Flavor, now time.Time, vals []string, ds []Decision) {
	if len(ds) == 0 {
		return
	}
	var stack [stackBufferCapacity]byte
	buf := stack[:0]
	// ends[i] is where the value of names[i] ends in buf.
	var (
		names [maxFieldsPerWrite]string
		ends  [maxFieldsPerWrite]int
		n     int
	)
	field := func(name string) {
		names[n], ends[n] = name, len(buf)
		n++
	}

	if f&Draft != 0 {
		for i := range ds {
			if i > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendPolicyItem(buf, &ds[i])
		}
		field(policyField)
		items := 0
		for i := range ds {
			if !ds[i].From.IsZero() {
				continue // an announcement: nothing spent on it yet
			}
			if items > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendLimitItem(buf, &ds[i])
			items++
		}
		if items > 0 {
			field(limitField)
		}
	}
	b := Binding(ds)
	if b >= 0 && f&(RateLimitFields|XRateLimit) != 0 {
		d := &ds[b]
		q := singleLimit(d.Result.Limit)
		reset := resetSeconds(&d.Result)
		if f&RateLimitFields != 0 {
			buf = strconv.AppendInt(buf, q, 10)
			field(oldLimitField)
			buf = strconv.AppendInt(buf, int64(max(0, d.Result.Remaining)), 10)
			field(oldRemainingField)
			buf = strconv.AppendInt(buf, reset, 10)
			field(oldResetField)
		}
		if f&XRateLimit != 0 {
			buf = strconv.AppendInt(buf, q, 10)
			field(xLimitField)
			buf = strconv.AppendInt(buf, int64(max(0, d.Result.Remaining)), 10)
			field(xRemainingField)
			buf = strconv.AppendInt(buf, now.Unix()+reset, 10)
			field(xResetField)
		}
	}
	if b >= 0 && !ds[b].Result.Allowed {
		// The binding denial has the longest wait of all denials.
		buf = strconv.AppendInt(buf, RetryAfterSeconds(ds[b].Result.RetryAfter), 10)
		field(retryAfterField)
	}
	if n == 0 {
		return
	}

	all := string(buf)
	if vals == nil {
		vals = make([]string, n)
	}
	start := 0
	for i := 0; i < n; i++ {
		vals[i] = all[start:ends[i]]
		start = ends[i]
		h[names[i]] = vals[i : i+1 : i+1]
	}
}

// singleLimit is the number RateLimit-Limit and X-RateLimit-Limit carry:
// the most Remaining can ever be, so that clients reading the pair see
// Remaining count down from Limit. That is Burst for the bucket algorithms
// and q for the window ones.
func singleLimit(l tollgate.Limit) int64 {
	switch l.Algorithm {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
		if l.Burst > 0 {
			return int64(l.Burst)
		}
	}
	q, _ := quota(l)
	return q
}

// resetSeconds is the t parameter: when the request was denied, the first
// moment it can pass; otherwise when the full allowance is back.
func resetSeconds(r *tollgate.Result) int64 {
	if !r.Allowed {
		return RetryAfterSeconds(r.RetryAfter)
	}
	return seconds(r.ResetAfter)
}

// quota returns the q and w parameters of RateLimit-Policy for l: q units per
// w whole seconds. A period that is not a whole number of seconds has its
// window rounded up and its quota scaled down, so the policy never promises
// more than the limit admits. An invalid limit gives 0, 0.
func quota(l tollgate.Limit) (q, w int64) {
	if l.Rate < 1 || l.Period <= 0 {
		return 0, 0
	}
	p := uint64(l.Period)
	sec := uint64(time.Second)
	if p%sec == 0 {
		return int64(l.Rate), int64(p / sec)
	}
	wn := p/sec + 1
	// q = ⌊Rate × w / Period⌋, in 128 bits: Rate × w × 1e9 overflows 64.
	hi, lo := bits.Mul64(uint64(l.Rate), wn*sec)
	if hi >= p {
		return math.MaxInt64, int64(wn)
	}
	qn, _ := bits.Div64(hi, lo, p)
	return int64(min(qn, math.MaxInt64)), int64(wn)
}

func appendPolicyItem(b []byte, d *Decision) []byte {
	b = appendString(b, d.Policy)
	q, w := quota(d.Result.Limit)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, q, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, w, 10)
	l := d.Result.Limit
	switch l.Algorithm {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
		if l.Burst != l.Rate && l.Burst > 0 {
			b = append(b, ";"+burstParam+"="...)
			b = strconv.AppendInt(b, int64(l.Burst), 10)
		}
	}
	if d.DryRun {
		b = append(b, ";"+dryRunParam...)
	}
	if !d.From.IsZero() {
		b = append(b, ";"+fromParam+"="...)
		b = strconv.AppendInt(b, d.From.Unix(), 10)
	}
	return b
}

func appendLimitItem(b []byte, d *Decision) []byte {
	b = appendString(b, d.Policy)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, int64(max(0, d.Result.Remaining)), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, resetSeconds(&d.Result), 10)
	if d.DryRun {
		b = append(b, ";"+dryRunParam...)
	}
	return b
}

// appendString appends s as a structured-field String (RFC 9651 §3.3.3):
// quoted, with '"' and '\' escaped; bytes outside printable ASCII, which a
// String cannot hold, become '_'.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '_')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
