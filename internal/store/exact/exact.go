// Package exact holds the integer arithmetic that the Lua scripts and the
// Go algorithms share, and the bounds that keep it exact.
//
// Redis runs Lua 5.1, whose only number type is an IEEE double: integers are
// exact up to 2^53 and not beyond. Every quantity tollgate keeps — times in
// microseconds, tokens in fixed-point units, counters — is an integer kept
// below that bound, so a script in Redis and the same algorithm in Go compute
// bit-for-bit the same results. The bounds below are what Limit.Validate
// enforces to make that true.
package exact

import "math/bits"

// Max is 2^53, the first integer a double cannot tell from its neighbour.
// Every stored value and every intermediate product stays below it.
const Max = 1 << 53

// MaxHorizon is the longest span, in microseconds, that state may reach past
// the current time: a period, a GCRA burst tolerance, a leaky bucket's
// maximum delay. 2^46 µs is about 814 days.
const MaxHorizon = 1 << 46

// MaxNow is the latest time, in microseconds since the Unix epoch, that a
// decision may be made at: now plus two horizons still fits below Max. It is
// in the year 2250.
const MaxNow = Max - 2*MaxHorizon

// GCD returns the greatest common divisor of a and b (both > 0).
func GCD(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// CeilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func CeilDiv(a, b int64) int64 {
	return (a + b - 1) / b
}

// SlidingGrain is the time step, in µs, at which the sliding window counter
// weighs the previous window: a millisecond for periods of a second or more
// that are whole milliseconds (finer steps change nothing a client can see,
// and the coarser step lets rate × period/grain stay below Max for large
// limits), a microsecond otherwise.
func SlidingGrain(periodUS int64) int64 {
	if periodUS >= 1_000_000 && periodUS%1000 == 0 {
		return 1000
	}
	return 1
}

// CalendarGrain is the step, in µs, at which the sliding window counter
// weighs the previous window of a calendar limit: a second. Calendar
// windows start and end on whole seconds, and a month counted in seconds
// leaves room for rates up to 814,453,057 a month below 2^51.
const CalendarGrain = 1_000_000

// MulDiv returns ⌊v·to/from⌋ computed exactly in 128 bits, or limit when that
// is larger, for 0 ≤ v, 0 ≤ to, 1 ≤ from and limit ≥ 0. The stores convert
// a fixed-point amount kept with another unit (the limit's rate changed)
// with it: a double computes 498·500,000/1,000,000 as 248.99999999999997.
func MulDiv(v, to, from, limit int64) int64 {
	q, _, ok := mulDiv(v, to, from)
	if !ok || q > uint64(limit) {
		return limit
	}
	return int64(q)
}

// MulDivUp returns ⌈v·to/from⌉, or limit when that is larger, as MulDiv.
func MulDivUp(v, to, from, limit int64) int64 {
	q, r, ok := mulDiv(v, to, from)
	if r > 0 {
		q++
	}
	if !ok || q > uint64(limit) {
		return limit
	}
	return int64(q)
}

// mulDiv returns the quotient and remainder of v·to/from, and false when
// the quotient does not fit in 64 bits.
func mulDiv(v, to, from int64) (q, r uint64, ok bool) {
	hi, lo := bits.Mul64(uint64(v), uint64(to))
	if hi >= uint64(from) {
		return 0, 0, false
	}
	q, r = bits.Div64(hi, lo, uint64(from))
	return q, r, q < 1<<63
}
