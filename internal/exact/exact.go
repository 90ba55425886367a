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
