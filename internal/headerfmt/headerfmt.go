// Package headerfmt writes the rate-limit header fields. Package headers
// is its face to users, and documents what the fields mean; the doors
// (httplimit) call it directly for what headers does not offer: the
// fields' slices and the text of their values in memory of the response's
// own, and a RateLimit-Policy value made once for a rule rather than on
// every response. It is one writer, so that every way of writing the
// fields writes the same bytes.
package headerfmt

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/calendar"
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
	MaxFields           = 9 // two draft fields, three and three older ones, Retry-After
	stackBufferCapacity = 256
)

// Flavor is headers.Flavor: which fields Write sets.
type Flavor uint8

// The flavours, as package headers defines them.
const (
	Draft Flavor = 1 << iota
	RateLimitFields
	XRateLimit
)

// Decision is headers.Decision, field for field, so that a
// []headers.Decision can be read as a []Decision (package headers checks
// that the two stay convertible).
type Decision struct {
	Policy string
	Result tollgate.Result
	DryRun bool
	From   time.Time
	// PolicyOnly: listed in RateLimit-Policy only, never binding.
	PolicyOnly bool
}

// Binding is headers.Binding: it returns the index of the decision that decides the request and
// is reported in the single-value flavours, or -1 when there is none (no
// decisions, or only dry-run ones). Among denials it is the one with the
// longest RetryAfter; when every binding decision allowed the request, the
// one with the least Remaining, and among those the longest ResetAfter.
func Binding(ds []Decision) int {
	best := -1
	for i := range ds {
		d := &ds[i]
		if d.DryRun || !d.From.IsZero() || d.PolicyOnly {
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

// Seconds rounds d up to whole seconds, as Retry-After and the reset fields
// need: a client told to come back in ⌊d⌋ seconds comes back early and is
// denied again. It returns 0 for d ≤ 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfterSeconds returns the Retry-After value for a denial that may be
// retried after d: Seconds(d), but at least 1, because "Retry-After: 0" tells
// a denied client to come straight back.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(1, Seconds(d))
}

// Write sets the fields headers.Write sets, byte for byte, with the
// fields' slices in vals (a new array when vals is too short) and their
// values' text in text (a new string when it does not fit). When policy is
// not "", it is the value RateLimit-Policy has for ds, made before (by
// Write of the same decisions, or decisions of the same policies, limits,
// dry run and announcements), and is written as it is. h keeps pointers
// into vals and text: they serve one response, and must never be written
// again while h or any of its values may be in use.
func Write(h http.Header, f Flavor, now time.Time, vals []string, text []byte, policy string, ds []Decision) {
	if len(ds) == 0 {
		return
	}
	var stack [stackBufferCapacity]byte
	buf := stack[:0]
	// ends[i] is where the value of names[i] ends in buf; the value of
	// names[given], if any, is policy instead.
	var (
		names [MaxFields]string
		ends  [MaxFields]int
		n     int
		given = -1
	)
	field := func(name string) {
		names[n], ends[n] = name, len(buf)
		n++
	}

	if f&Draft != 0 {
		if policy != "" {
			given = n
		} else {
			for i := range ds {
				if i > 0 {
					buf = append(buf, ", "...)
				}
				buf = appendPolicyItem(buf, &ds[i])
			}
		}
		field(policyField)
		items := 0
		for i := range ds {
			if !ds[i].From.IsZero() || ds[i].PolicyOnly {
				continue // an announcement (nothing spent on it yet), or stood for
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

	var all string
	if len(buf) <= len(text) {
		// text is the caller's, for this response only: written once,
		// here, and never again while the strings made of it live.
		copy(text, buf)
		all = unsafe.String(unsafe.SliceData(text), len(buf))
	} else {
		all = string(buf)
	}
	if len(vals) < n {
		vals = make([]string, n)
	}
	start := 0
	for i := 0; i < n; i++ {
		if i == given {
			vals[i] = policy
		} else {
			vals[i] = all[start:ends[i]]
		}
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
	q, _ := Quota(l)
	return q
}

// resetSeconds is the t parameter: when the request was denied, the first
// moment it can pass; otherwise when the full allowance is back.
func resetSeconds(r *tollgate.Result) int64 {
	if !r.Allowed {
		return RetryAfterSeconds(r.RetryAfter)
	}
	return Seconds(r.ResetAfter)
}

// Quota returns the q and w parameters of RateLimit-Policy for l: q units per
// w whole seconds. A period that is not a whole number of seconds has its
// window rounded up and its quota scaled down, so the policy never promises
// more than the limit admits. A calendar window's w is its unit's longest
// nominal length: 86400, 604800 or 2678400 (31 days); its RateLimit t says
// when it ends. An invalid limit gives 0, 0.
func Quota(l tollgate.Limit) (q, w int64) {
	if d := calendar.Nominal(l.Calendar.Unit); d > 0 && l.Rate >= 1 {
		return int64(l.Rate), int64(d / time.Second)
	}
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
	q, w := Quota(d.Result.Limit)
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
