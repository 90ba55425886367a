package tollgate

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/store/calendar"
	"github.com/tollgate/tollgate/internal/store/exact"
)

// Algorithm selects how a Limit counts. The zero value is TokenBucket.
//
// All six are exact in the same integer arithmetic in Redis (Lua) and in
// memory (Go), so a limit behaves identically on every Store.
type Algorithm uint8

const (
	// TokenBucket holds up to Burst tokens and adds Rate tokens per Period,
	// continuously. A request of cost n takes n tokens. It forgives short
	// bursts up to Burst and averages Rate over long spans: the default for
	// APIs whose clients legitimately burst.
	TokenBucket Algorithm = iota
	// GCRA (generic cell rate algorithm) has token bucket semantics kept in
	// a single value, the theoretical arrival time: whole microseconds plus
	// a fraction, so the emission interval Period/Rate is exact at every
	// rate (3 per second is one per 333,333⅓ µs; 2,000,000 per second one
	// per half µs). As long as the clock does not step back it decides
	// exactly as TokenBucket does; after a step back it counts the lag
	// against the key, where TokenBucket lets the key spend what it has.
	GCRA
	// FixedWindow counts requests in windows of Period aligned to the Unix
	// epoch (a per-day limit resets at midnight UTC), or in the calendar's
	// days, weeks or months of a time zone (Limit.Calendar), and admits Rate
	// per window. Cheapest; but a client can send Rate at the end of one
	// window and Rate again at the start of the next: twice the limit in
	// moments.
	FixedWindow
	// SlidingWindowLog keeps the time of every admitted request and admits
	// at most Rate in any span of Period. Exact, but memory and the cost of
	// a decision grow with Rate, which is at most MaxLogRate: for
	// low-volume, high-stakes endpoints such as login.
	SlidingWindowLog
	// SlidingWindowCounter keeps the counts of the current and the previous
	// fixed window and weighs the previous one by how much of it still
	// overlaps the sliding window. Near-exact in constant memory: the usual
	// choice for public APIs. With Limit.Calendar its windows are calendar
	// ones, of unequal lengths: the previous window weighs the share of the
	// current one still to come (see Calendar).
	SlidingWindowCounter
	// LeakyBucket drains at Rate per Period and holds Burst. As a policer
	// (MaxDelay 0) it rejects what would overflow and decides exactly as
	// TokenBucket does. As a shaper (MaxDelay > 0) it admits an overflowing
	// request with Result.Delay set to when it may go, up to MaxDelay, so
	// what leaves is spaced at Rate: for fragile backends and webhooks.
	// The Delay never exceeds MaxDelay, also after the clock stepped back
	// (the time the clock went back is part of the Delay); a look (n = 0)
	// reports no Delay, as it sends nothing.
	// A level is read as at most what drains in 2^47µs (about 4.5 years)
	// under the limit reading it, and a Settler's charge fills it no
	// further. What a limit admits itself always drains sooner: only a
	// bucket filled at a far higher Rate and then read at a much slower
	// one, or a charge of years of debt, is ever capped.
	LeakyBucket

	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{
	TokenBucket:          "token_bucket",
	GCRA:                 "gcra",
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	LeakyBucket:          "leaky_bucket",
}

// Algorithms lists every algorithm, in the order of their constants.
func Algorithms() []Algorithm {
	return []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket}
}

// String returns the algorithm's name as configuration files spell it,
// such as "token_bucket".
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// ParseAlgorithm returns the algorithm named s, as Algorithm.String spells it.
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, name := range algorithmNames {
		if s == name {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q (want one of token_bucket, gcra, fixed_window, sliding_window_log, sliding_window_counter, leaky_bucket)", ErrInvalidLimit, s)
}

// MarshalText implements encoding.TextMarshaler.
func (a Algorithm) MarshalText() ([]byte, error) {
	if a >= numAlgorithms {
		return nil, fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, a)
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Algorithm) UnmarshalText(text []byte) error {
	v, err := ParseAlgorithm(string(text))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Limit says how much a key may do. It is a value: pass it on every call, so
// a Limiter holds no per-key configuration and a plan change takes effect on
// the next request.
//
// Rate events are allowed per Period. Burst is the capacity of TokenBucket,
// GCRA and LeakyBucket (how many may arrive at once); 0 means a burst of
// Rate, as in the rules files. The window algorithms admit Rate per window
// and ignore Burst. MaxDelay > 0 turns a LeakyBucket
// into a shaper (see LeakyBucket) and is invalid on other algorithms.
//
// The state of a key is kept per (key, Algorithm, Period, Calendar):
// changing Rate or Burst keeps what the key has spent, changing the
// algorithm, the period or the calendar starts afresh.
type Limit struct {
	Algorithm Algorithm
	Rate      int
	Period    time.Duration
	Burst     int
	MaxDelay  time.Duration
	// Calendar, when its Unit is set, makes a FixedWindow or
	// SlidingWindowCounter count Rate per calendar day, week or month of a
	// time zone instead of per Period since the Unix epoch; Period is then
	// 0. The zero Calendar keeps the epoch's windows.
	Calendar Calendar
}

// Calendar names calendar windows: a quota that resets at local midnight,
// on Monday or on the 1st of the month, as billing plans do. It is one
// field of Limit, not a new kind of limit, so that everything taking a
// Limit (stores, middleware, headers) takes a calendar one unchanged.
//
// Unit is "day", "week" (Monday 00:00 to Monday 00:00) or "month" (the 1st
// at 00:00 to the next 1st); Zone is the IANA name of the time zone whose
// calendar it is, such as "Europe/Berlin", or "UTC". "" and "Local" are
// refused: replicas must agree on every window's edges. The zone's rules
// come from the time zone database Go finds (the system's, or one embedded
// with time/tzdata), which replicas must share.
//
// A window starts at the first instant whose local date is its day (local
// midnight, or the end of a DST gap that skips midnight) and ends where the
// next starts: a day across a DST change is 23 or 25 hours long, a month
// 28 to 31 days. ResetAfter and RetryAfter run to that instant exactly.
//
// Only the window algorithms have windows: a Calendar on TokenBucket,
// GCRA, LeakyBucket or SlidingWindowLog is refused (a bucket refills
// continuously at Rate per Period, and a log counts any span of Period;
// neither has an edge to put on the calendar).
//
// A SlidingWindowCounter estimates, at instant t of the window [s, e), the
// previous window's count × (e − t)/(e − s) plus the current count: the
// previous window weighs the share of the current one still to come,
// whatever the two windows' lengths, counted in whole seconds. Its Rate is
// at most 814,453,057 (Rate × the seconds of 32 days stays below 2^51).
//
// A calendar window's state is its own: apart from the key's
// epoch-aligned windows, and from another unit's or zone's (the zone's
// name is part of the state's name, so two names of one zone, such as
// US/Pacific and America/Los_Angeles, are two states). Settling a
// reservation (Settler) is not supported under a calendar window.
type Calendar struct {
	Unit string
	Zone string
}

// PerSecond returns a token bucket of rate per second with a burst of rate.
func PerSecond(rate int) Limit { return per(rate, time.Second) }

// PerMinute returns a token bucket of rate per minute with a burst of rate.
func PerMinute(rate int) Limit { return per(rate, time.Minute) }

// PerHour returns a token bucket of rate per hour with a burst of rate.
func PerHour(rate int) Limit { return per(rate, time.Hour) }

// PerDay returns a token bucket of rate per day with a burst of rate.
func PerDay(rate int) Limit { return per(rate, 24*time.Hour) }

func per(rate int, period time.Duration) Limit {
	return Limit{Algorithm: TokenBucket, Rate: rate, Period: period, Burst: rate}
}

// Validate reports why l cannot be used, as an error wrapping
// ErrInvalidLimit, or nil. Every Store calls it before doing anything.
//
// Beyond the obvious (Rate ≥ 1, Period > 0, Burst ≥ 0 for the bucket
// algorithms, a known Algorithm), the quantities a limit implies must stay
// exact in a double, the only number Redis's Lua has: Period and MaxDelay are
// whole microseconds of at most 2^46 µs (about 814 days), and the counters a
// limit needs stay below 2^53. In practice this rejects only extreme limits,
// such as a token bucket of 1,000,003 (a prime) per day with a burst of a
// million; 1,000,000 or 999,999 per day are fine, because the rate and the
// period are reduced by their common divisor first.
func (l Limit) Validate() error {
	_, err := l.params()
	return err
}

// Capacity returns the largest cost a single request can ever be admitted
// with under l: Burst for the bucket algorithms (plus what MaxDelay can
// queue for a shaping LeakyBucket), Rate for the window algorithms. A cost
// above it fails with ErrCostExceedsBurst. It returns 0 for an invalid limit.
func (l Limit) Capacity() int {
	p, err := l.params()
	if err != nil {
		return 0
	}
	return int(p.Capacity)
}

// String describes l, such as "10/s burst 20 token_bucket" or
// "1000/24h fixed_window".
func (l Limit) String() string {
	b := make([]byte, 0, 48)
	b = strconv.AppendInt(b, int64(l.Rate), 10)
	b = append(b, '/')
	switch {
	case l.Calendar != (Calendar{}):
		b = append(b, l.Calendar.Unit...)
		b = append(b, ' ')
		b = append(b, l.Calendar.Zone...)
	case l.Period == time.Second:
		b = append(b, 's')
	case l.Period == time.Minute:
		b = append(b, 'm')
	case l.Period == time.Hour:
		b = append(b, 'h')
	default:
		b = append(b, shortDuration(l.Period)...)
	}
	switch l.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		b = append(b, " burst "...)
		burst := l.Burst
		if burst == 0 {
			burst = l.Rate
		}
		b = strconv.AppendInt(b, int64(burst), 10)
	}
	b = append(b, ' ')
	b = append(b, l.Algorithm.String()...)
	if l.MaxDelay != 0 {
		b = append(b, " max_delay "...)
		b = append(b, shortDuration(l.MaxDelay)...)
	}
	return string(b)
}

// shortDuration drops the zero tails time.Duration.String prints ("24h0m0s"
// becomes "24h").
func shortDuration(d time.Duration) string {
	s := d.String()
	for _, tail := range []string{"0s", "0m"} {
		if len(s) > len(tail)+1 && s[len(s)-len(tail):] == tail && (s[len(s)-len(tail)-1] < '0' || s[len(s)-len(tail)-1] > '9') {
			s = s[:len(s)-len(tail)]
		}
	}
	return s
}

// Params are the integers a Store computes a decision with, derived from a
// valid Limit by Limit.Params. Stores pass them to their Lua scripts as
// arguments, so the reduction and the bounds are computed once, in Go.
type Params struct {
	Algorithm Algorithm
	// PeriodUS is the period in microseconds; 0 under a Calendar.
	PeriodUS int64
	// Calendar is the loaded Limit.Calendar, nil for windows aligned to
	// the epoch. One pointer per (unit, zone) for the life of the process.
	Calendar *calendar.Spec
	// Rate and Burst as in Limit.
	Rate, Burst int64
	// Unit is how many fixed-point units make one token (TokenBucket,
	// LeakyBucket): the period divided by gcd(rate, period). UnitRate is how
	// many units are added (or leak) per microsecond: the rate divided by
	// the same gcd. Both are exact, so refill never rounds. GCRA counts time
	// in the same units: a µs is UnitRate units, the emission interval Unit.
	Unit, UnitRate int64
	// IntervalUS is the emission interval period/rate rounded up to a
	// whole µs. GCRA itself counts the interval exactly, as Unit units of
	// 1/UnitRate µs; this rounded value bounds how far ahead a burst may
	// reach (Burst × IntervalUS ≤ 2^46 µs).
	IntervalUS int64
	// MaxDelayUS is a shaping LeakyBucket's maximum delay in µs.
	MaxDelayUS int64
	// Capacity is the largest admissible cost (see Limit.Capacity).
	Capacity int64
	// MaxDebt is the most cost a key may owe beyond its capacity after a
	// Settler's extra charge (see Settler): one Capacity, less where the
	// doubled state would not count exactly below 2^53. For FixedWindow
	// and SlidingWindowLog it is Rate; for SlidingWindowCounter
	// min(Rate, ⌊2^53/4 ÷ steps⌋ − Rate), steps the period in the
	// counter's grains; for the bucket algorithms max(0, min(Capacity,
	// ⌊(2^53 − 1)/Unit⌋ − Capacity)), so (Capacity + MaxDebt) × Unit <
	// 2^53, and (Burst + MaxDebt) × IntervalUS ≤ 2^47 µs.
	MaxDebt int64
}

// Params validates l and returns the integers a Store decides with.
func (l Limit) Params() (Params, error) { return l.params() }

// paramsCache remembers the Params of recently used valid limits. Every
// decision validates its limit, and the arithmetic behind it (a gcd, a few
// 64-bit divisions) cost a memory-store decision a fifth of its time; a
// service uses a handful of limits, so a small table of immutable entries,
// read with an atomic load and a comparison, answers almost every call. The
// table is two-way: a limit may sit in either entry of its set, so two
// limits that hash alike both stay; only a third alternating with them in
// the same set is validated again (and allocates) on each call.
var paramsCache [64][2]atomic.Pointer[cachedParams]

type cachedParams struct {
	limit  Limit
	params Params
}

// cacheSet returns the paramsCache set of l.
func cacheSet(l Limit) *[2]atomic.Pointer[cachedParams] {
	h := uint64(l.Rate)*0x9e3779b97f4a7c15 ^ uint64(l.Period)*0xc2b2ae3d27d4eb4f ^
		uint64(l.Burst)*0x165667b19e3779f9 ^ uint64(l.MaxDelay) ^ uint64(l.Algorithm) ^ uint64(len(l.Calendar.Zone))<<40
	return &paramsCache[(h^h>>29)%uint64(len(paramsCache))]
}

// cached returns l's cached Params, or nil.
func (l Limit) cached() *cachedParams {
	set := cacheSet(l)
	if c := set[0].Load(); c != nil && c.limit == l {
		return c
	}
	if c := set[1].Load(); c != nil && c.limit == l {
		return c
	}
	return nil
}

func (l Limit) params() (Params, error) {
	if c := l.cached(); c != nil {
		return c.params, nil
	}
	p, err := l.computeParams()
	if err == nil {
		// The first entry keeps the limit that took it; newcomers take
		// the second, once the first is in use.
		set, c := cacheSet(l), &cachedParams{limit: l, params: p}
		if !set[0].CompareAndSwap(nil, c) {
			set[1].Store(c)
		}
	}
	return p, err
}

func (l Limit) computeParams() (Params, error) {
	p := Params{Algorithm: l.Algorithm, Rate: int64(l.Rate), Burst: int64(l.Burst)}
	if l.Algorithm >= numAlgorithms {
		return p, fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, l.Algorithm)
	}
	if l.Rate < 1 || int64(l.Rate) >= exact.Max {
		return p, fmt.Errorf("%w: rate must be between 1 and 2^53, got %d", ErrInvalidLimit, l.Rate)
	}
	if l.Calendar != (Calendar{}) {
		return l.calendarParams(p)
	}
	if l.Period <= 0 || l.Period%time.Microsecond != 0 || l.Period/time.Microsecond > exact.MaxHorizon {
		return p, fmt.Errorf("%w: period must be a whole number of microseconds between 1µs and 2^46µs (about 814 days), got %v", ErrInvalidLimit, l.Period)
	}
	if l.MaxDelay < 0 || l.MaxDelay%time.Microsecond != 0 || l.MaxDelay/time.Microsecond > exact.MaxHorizon {
		return p, fmt.Errorf("%w: max delay must be a whole number of microseconds between 0 and 2^46µs, got %v", ErrInvalidLimit, l.MaxDelay)
	}
	if l.MaxDelay > 0 && l.Algorithm != LeakyBucket {
		return p, fmt.Errorf("%w: max delay applies only to leaky_bucket (shaping), not to %s", ErrInvalidLimit, l.Algorithm)
	}
	p.PeriodUS = int64(l.Period / time.Microsecond)
	p.MaxDelayUS = int64(l.MaxDelay / time.Microsecond)

	switch l.Algorithm {
	case SlidingWindowLog:
		if p.Rate > MaxLogRate {
			return p, fmt.Errorf("%w: sliding_window_log allows a rate of at most %d (MaxLogRate) per period, got %d: it keeps an entry per request, and more would hold Redis for over a millisecond a decision; use sliding_window_counter", ErrInvalidLimit, MaxLogRate, l.Rate)
		}
		p.Capacity, p.MaxDebt = p.Rate, p.Rate
	case FixedWindow:
		p.Capacity, p.MaxDebt = p.Rate, p.Rate
	case SlidingWindowCounter:
		// The weighted check adds up to three counts times the period in
		// grains; a quarter of 2^53 leaves room for all of them.
		if p.Rate > exact.Max/4/(p.PeriodUS/exact.SlidingGrain(p.PeriodUS)) {
			return p, fmt.Errorf("%w: %d per %v is too fine for the sliding window counter to count exactly (rate × period in ms must stay below 2^51); use a shorter period or fixed_window", ErrInvalidLimit, l.Rate, l.Period)
		}
		p.Capacity = p.Rate
		p.MaxDebt = min(p.Rate, exact.Max/4/(p.PeriodUS/exact.SlidingGrain(p.PeriodUS))-p.Rate)
	case TokenBucket, GCRA, LeakyBucket:
		if l.Burst < 0 {
			return p, fmt.Errorf("%w: %s needs a burst of at least 1 (0 for a burst of rate), got %d", ErrInvalidLimit, l.Algorithm, l.Burst)
		}
		if l.Burst == 0 {
			p.Burst = p.Rate
		}
		g := exact.GCD(p.Rate, p.PeriodUS)
		p.Unit, p.UnitRate = p.PeriodUS/g, p.Rate/g
		p.IntervalUS = exact.CeilDiv(p.PeriodUS, p.Rate)
		p.Capacity = p.Burst
		// Tokens are counted in units of 1/Unit token: a full bucket, plus
		// what a shaper may queue, must fit below 2^53; and so must the
		// span of time that much state stands for. GCRA counts time in the
		// same units (a µs is UnitRate of them): how far its TAT may lie
		// ahead of now is Burst × Unit units, below 2^53 by the same bound,
		// a fraction of a µs is below UnitRate < 2^53, and a TAT that lies
		// further ahead (a clock stepped back) is compared in whole µs
		// without multiplying, so no difference it computes exceeds 2^53.
		if p.Burst > exact.Max/p.Unit || p.Burst > exact.MaxHorizon/p.IntervalUS {
			return p, fmt.Errorf("%w: burst %d at %d per %v is too large to count exactly (burst × period ÷ gcd(rate, period in µs) must stay below 2^53, and burst × period/rate below 2^46µs)", ErrInvalidLimit, l.Burst, l.Rate, l.Period)
		}
		if p.MaxDelayUS > 0 {
			if p.MaxDelayUS > (exact.Max-p.Burst*p.Unit)/p.UnitRate {
				return p, fmt.Errorf("%w: max delay %v at %d per %v is too large to count exactly", ErrInvalidLimit, l.MaxDelay, l.Rate, l.Period)
			}
			// The largest request a shaper admits from an empty bucket is
			// the one whose excess over Burst drains within MaxDelay.
			p.Capacity += p.MaxDelayUS * p.UnitRate / p.Unit
		}
		p.MaxDebt = max(0, min(p.Capacity, (exact.Max-1)/p.Unit-p.Capacity))
	}
	return p, nil
}

// calendarParams returns the Params of a limit with a Calendar, whose
// algorithm and rate p holds, checked.
func (l Limit) calendarParams(p Params) (Params, error) {
	if l.Algorithm != FixedWindow && l.Algorithm != SlidingWindowCounter {
		return p, fmt.Errorf("%w: a calendar applies only to fixed_window and sliding_window_counter, not to %s: it has no window to put on the calendar", ErrInvalidLimit, l.Algorithm)
	}
	spec, err := calendar.Lookup(l.Calendar.Unit, l.Calendar.Zone)
	if err != nil {
		return p, fmt.Errorf("%w: %w", ErrInvalidLimit, err)
	}
	if l.Period != 0 || l.MaxDelay != 0 {
		return p, fmt.Errorf("%w: a calendar %s is its own window: leave Period 0 (and MaxDelay), got %v", ErrInvalidLimit, l.Calendar.Unit, l.Period)
	}
	p.Calendar = spec
	p.Capacity, p.MaxDebt = p.Rate, p.Rate
	if l.Algorithm == SlidingWindowCounter {
		steps := spec.Unit.MaxLen() / exact.CalendarGrain
		if p.Rate > exact.Max/4/steps {
			return p, fmt.Errorf("%w: %d per calendar %s is too fine for the sliding window counter to count exactly (rate × the seconds of %d days must stay below 2^51); use fixed_window", ErrInvalidLimit, l.Rate, l.Calendar.Unit, spec.Unit.MaxLen()/86_400_000_000)
		}
		p.MaxDebt = min(p.Rate, exact.Max/4/steps-p.Rate)
	}
	return p, nil
}

// MaxLogRate is the largest Rate a SlidingWindowLog accepts. The log keeps
// one entry per admitted unit of cost, and its costliest decision — a full
// log that leaves the window, then a request of cost Rate — writes Rate
// entries at once, during which a Redis serves no one else. At 1,000 that
// takes about a millisecond of a redis-server 7.0's time (each added entry
// costs it about 0.9 µs); the memory store keeps the same bound, so a limit
// is valid on every Store. For higher rates use SlidingWindowCounter, which
// is constant in time and memory.
const MaxLogRate = 1000

// MaxKeyLen is the longest key, in bytes, a Store accepts.
const MaxKeyLen = 512

// CheckRequest validates one request — its key, limit and cost — the way
// every Store does before it touches any state, and returns the limit's
// Params. A key must be 1 to MaxKeyLen bytes; n must be 0 (look without
// spending) up to the limit's Capacity.
func CheckRequest(key string, l Limit, n int) (Params, error) {
	// Every decision comes here: a valid request under a recently used
	// limit is answered from the cache without another call.
	if c := l.cached(); c != nil && len(key) > 0 && len(key) <= MaxKeyLen && n >= 0 && int64(n) <= c.params.Capacity {
		return c.params, nil
	}
	return checkRequest(key, l, n)
}

func checkRequest(key string, l Limit, n int) (Params, error) {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return Params{}, fmt.Errorf("%w: a key must be 1 to %d bytes, got %d", ErrInvalidKey, MaxKeyLen, len(key))
	}
	p, err := l.params()
	if err != nil {
		return p, err
	}
	if n < 0 {
		return p, fmt.Errorf("%w: cost must be at least 1 (0 to look without spending), got %d", ErrInvalidCost, n)
	}
	if int64(n) > p.Capacity {
		return p, fmt.Errorf("%w: cost %d, but %s admits at most %d at once", ErrCostExceedsBurst, n, l, p.Capacity)
	}
	return p, nil
}

// Errors returned by Validate, stores and the Limiter. Test for them with
// errors.Is: the returned errors wrap them with the details.
var (
	// ErrInvalidLimit: a Limit that Validate rejects.
	ErrInvalidLimit = errors.New("tollgate: invalid limit")
	// ErrInvalidKey: an empty key, or one longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("tollgate: invalid key")
	// ErrInvalidCost: a cost below 1 (or below 0 where 0 means "look").
	ErrInvalidCost = errors.New("tollgate: invalid cost")
	// ErrCostExceedsBurst: a cost larger than the limit can ever admit,
	// so waiting would not help. Nothing is spent.
	ErrCostExceedsBurst = errors.New("tollgate: cost exceeds what the limit can ever admit")
	// ErrWaitExceedsDeadline: Wait would have to wait past the context's
	// deadline; it returns at once instead of sleeping in vain.
	ErrWaitExceedsDeadline = errors.New("tollgate: wait would exceed the context deadline")
)
