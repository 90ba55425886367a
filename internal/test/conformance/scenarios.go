package conformance

import (
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
)

// step is one call at T0+at with cost n and the Result it must return.
type step struct {
	at   time.Duration
	n    int
	want tollgate.Result
	// limit, when set, replaces the scenario's limit for this step: a
	// plan change on a key that already has state.
	limit tollgate.Limit
	// wait is real time to let pass before the step, so that Redis, whose
	// TTLs run in real time, has expired what the test's clock says has.
	wait time.Duration
}

// under returns st made under l instead of the scenario's limit.
func under(l tollgate.Limit, st step) step {
	st.limit = l
	return st
}

// peek is a look (n = 0) that reports remaining and reset.
func peek(at time.Duration, remaining int, reset time.Duration) step {
	return step{at: at, want: tollgate.Result{Allowed: true, Remaining: remaining, ResetAfter: reset}}
}

func allow(at time.Duration, n, remaining int, reset time.Duration) step {
	return step{at: at, n: n, want: tollgate.Result{Allowed: true, Remaining: remaining, ResetAfter: reset}}
}

func deny(at time.Duration, n, remaining int, retry, reset time.Duration) step {
	return step{at: at, n: n, want: tollgate.Result{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}}
}

func shaped(at time.Duration, n, remaining int, delay, reset time.Duration) step {
	return step{at: at, n: n, want: tollgate.Result{Allowed: true, Remaining: remaining, Delay: delay, ResetAfter: reset}}
}

func join(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

type scenario struct {
	name  string
	limit tollgate.Limit
	steps []step
	// reset, when > 0, calls Reset before step number reset.
	reset int
}

// 2 per second, burst 5: a token every 500ms.
var bucket = tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 2, Period: time.Second, Burst: 5}

func with(l tollgate.Limit, a tollgate.Algorithm) tollgate.Limit {
	l.Algorithm = a
	return l
}

// bucketSteps are what a 2/s burst-5 bucket must do; token bucket, GCRA and
// a policing leaky bucket all do exactly this.
func bucketSteps() []scenario {
	return []scenario{
		{name: "burst then refill", limit: bucket, steps: []step{
			allow(0, 1, 4, 500*ms),
			allow(0, 1, 3, 1000*ms),
			peek(0, 3, 1000*ms), // look, spend nothing
			allow(0, 1, 2, 1500*ms),
			allow(0, 1, 1, 2000*ms),
			allow(0, 1, 0, 2500*ms),
			deny(0, 1, 0, 500*ms, 2500*ms),
			deny(250*ms, 1, 0, 250*ms, 2250*ms), // half a token: not yet
			allow(500*ms, 1, 0, 2500*ms),        // one token refilled
			allow(3000*ms, 1, 4, 500*ms),        // full again, capped at 5
		}},
		{name: "cost n", limit: bucket, steps: []step{
			allow(0, 3, 2, 1500*ms),
			deny(0, 3, 2, 500*ms, 1500*ms), // needs one token more
			allow(500*ms, 3, 0, 2500*ms),
			deny(500*ms, 5, 0, 2500*ms, 2500*ms), // the whole burst: wait for it
			allow(3000*ms, 5, 0, 2500*ms),
		}},
		{name: "clock goes backwards", limit: bucket, steps: []step{
			allow(10*time.Second, 5, 0, 2500*ms),
			// One second back: no refill, and every duration includes the lag.
			deny(9*time.Second, 1, 0, 1500*ms, 3500*ms),
			deny(10*time.Second, 1, 0, 500*ms, 2500*ms),
			allow(10500*ms, 1, 0, 2500*ms),
			// An hour back: still not rewarded.
			deny(10500*ms-time.Hour, 1, 0, time.Hour+500*ms, time.Hour+2500*ms),
		}},
		{name: "reset forgets", limit: bucket, reset: 2, steps: []step{
			allow(0, 5, 0, 2500*ms),
			deny(0, 1, 0, 500*ms, 2500*ms),
			allow(0, 1, 4, 500*ms), // after Reset: a fresh bucket
		}},
	}
}

func scenarios() []scenario {
	var out []scenario
	for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket} {
		for _, sc := range bucketSteps() {
			sc.limit = with(sc.limit, a)
			out = append(out, sc)
		}
	}
	// The token bucket counts 3 per second exactly: 1/3 token per
	// 333,333.3µs, kept as 3 units per µs of a million-unit token. GCRA keeps
	// the same thirds as a fraction of a µs, so it decides identically.
	for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket} {
		out = append(out, scenario{name: "thirds of a token", limit: tollgate.Limit{Algorithm: a, Rate: 3, Period: time.Second, Burst: 3}, steps: []step{
			allow(0, 1, 2, 333334*us),
			allow(0, 1, 1, 666667*us),
			allow(0, 1, 0, time.Second),
			deny(0, 1, 0, 333334*us, time.Second),
			deny(333333*us, 1, 0, 1*us, 666667*us),
			allow(333334*us, 1, 0, time.Second), // 1,000,002 units: 2 left over
			deny(333334*us, 1, 0, 333333*us, time.Second),
		}})
	}
	out = append(out, edgeScenarios()...)
	second := time.Second
	out = append(out,
		// Shaping: 2/s, burst 1, queue up to 1s. Requests that overflow go
		// later, spaced 500ms apart, until the queue is full.
		scenario{name: "shaping delays", limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: second, Burst: 1, MaxDelay: second}, steps: []step{
			shaped(0, 1, 0, 0, 500*ms),
			shaped(0, 1, 0, 500*ms, 1000*ms),
			shaped(0, 1, 0, 1000*ms, 1500*ms),
			deny(0, 1, 0, 500*ms, 1500*ms),
			shaped(500*ms, 1, 0, 1000*ms, 1500*ms),
			shaped(2500*ms, 2, 0, 500*ms, 1000*ms), // a cost of 2 from empty: the second half waits
		}},
		// Periods here are long enough that no state a later step reads has a
		// TTL under a second: Redis expires keys in real time.
		scenario{name: "fixed window", limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: 10 * second}, steps: []step{
			allow(0, 1, 2, 10*second),
			allow(9*second, 2, 0, 1*second),
			deny(9500*ms, 1, 0, 500*ms, 500*ms),
			allow(10*second, 1, 2, 10*second), // a new window
			deny(15*second, 3, 2, 5*second, 5*second),
			peek(15*second, 2, 5*second),
		}},
		// Calendar windows: T0 is 01:00 on 1 January in Berlin, whose day
		// ends at 23:00 UTC; January has 31 days and February 28.
		scenario{name: "calendar day in Berlin", limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 2, Calendar: tollgate.Calendar{Unit: "day", Zone: "Europe/Berlin"}}, steps: []step{
			allow(0, 2, 0, 23*time.Hour),
			deny(23*time.Hour-second, 1, 0, second, second),
			allow(23*time.Hour, 1, 1, 24*time.Hour), // 2 January, midnight in Berlin
		}},
		scenario{name: "calendar month, sliding", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 31, Calendar: tollgate.Calendar{Unit: "month", Zone: "UTC"}}, steps: []step{
			allow(0, 31, 0, 59*24*time.Hour), // weighs until February ends
			// 1 February: January weighs 31 × (steps − k)/steps, steps the
			// 2,419,200 seconds of February: a cost of 1 fits from
			// k = ⌈2,419,200 / 31⌉ = 78,039 s on.
			deny(31*24*time.Hour, 1, 0, 78_039*second, 28*24*time.Hour),
			allow(31*24*time.Hour+78_039*second, 1, 0, 28*24*time.Hour+31*24*time.Hour-78_039*second),
		}},
		scenario{name: "fixed window boundary", limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: time.Minute}, steps: join(
			// Twice the limit within a second, across the edge.
			[]step{allow(59*second, 1, 2, second), allow(59*second, 1, 1, second), allow(59*second, 1, 0, second)},
			[]step{allow(60*second, 1, 2, time.Minute), allow(60*second, 1, 1, time.Minute), allow(60*second, 1, 0, time.Minute)},
			[]step{deny(60*second, 1, 0, time.Minute, time.Minute)},
		)},
		scenario{name: "fixed window clock goes backwards", limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: second}, steps: []step{
			allow(2200*ms, 3, 0, 800*ms),
			// Back into window 1: it stays in window 2, full.
			deny(1500*ms, 1, 0, 1500*ms, 1500*ms),
			allow(3000*ms, 1, 2, 1000*ms),
		}},
		scenario{name: "sliding log", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 3, Period: second}, steps: []step{
			allow(0, 1, 2, 1000*ms),
			allow(300*ms, 1, 1, 1000*ms),
			allow(600*ms, 1, 0, 1000*ms),
			deny(900*ms, 1, 0, 100*ms, 700*ms),   // the entry at 0 leaves at 1s
			allow(1000*ms, 1, 0, 1000*ms),        // and has: (0s, 1s] holds 0.3, 0.6
			deny(1000*ms, 2, 0, 600*ms, 1000*ms), // 0.3 and 0.6 must both leave
		}},
		scenario{name: "sliding log same microsecond", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 3, Period: second}, steps: join(
			[]step{allow(5*second, 1, 2, 1000*ms), allow(5*second, 1, 1, 1000*ms), allow(5*second, 1, 0, 1000*ms)},
			[]step{deny(5*second, 1, 0, 1000*ms, 1000*ms)},
			[]step{allow(6*second, 2, 1, 1000*ms), allow(6*second, 1, 0, 1000*ms)},
		)},
		scenario{name: "sliding log clock goes backwards", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 3, Period: second}, steps: []step{
			allow(20*second, 2, 1, 1000*ms),
			allow(19500*ms, 1, 0, 1500*ms), // counted at 20s, the newest entry
			deny(19500*ms, 1, 0, 1500*ms, 1500*ms),
		}},
		// 4 per second; the previous window is weighed in 1ms steps.
		scenario{name: "sliding counter", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 4, Period: second}, steps: []step{
			allow(500*ms, 4, 0, 1500*ms),
			// At 1s the previous window weighs 4 in full; at 1.25s, 3.
			deny(1000*ms, 1, 0, 250*ms, 1000*ms),
			allow(1250*ms, 1, 0, 1750*ms),
			allow(1500*ms, 1, 0, 1500*ms), // 4 × 0.5 + 2 = 4
			deny(1500*ms, 1, 0, 250*ms, 1500*ms),
			peek(1750*ms, 1, 1250*ms),
		}},
		scenario{name: "sliding counter next window", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 4, Period: second}, steps: []step{
			allow(3000*ms, 4, 0, 2000*ms),
			// The window itself is full: wait until, in the next one, it
			// weighs 3 (a quarter of the way in).
			deny(3000*ms, 1, 0, 1250*ms, 2000*ms),
			allow(4250*ms, 1, 0, 1750*ms),
		}},
		scenario{name: "sliding counter boundary", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 4, Period: second}, steps: []step{
			allow(5999*ms, 4, 0, 1001*ms),
			deny(6000*ms, 4, 0, 1000*ms, 1000*ms), // no second burst at the edge
			deny(6000*ms, 1, 0, 250*ms, 1000*ms),
		}},
		scenario{name: "sliding counter clock goes backwards", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 4, Period: second}, steps: []step{
			allow(7500*ms, 2, 2, 1500*ms),
			allow(6500*ms, 1, 1, 2500*ms),         // stays in window 7
			deny(6500*ms, 2, 1, 1834*ms, 2500*ms), // window 7 too full: at 8.334s it weighs 3 × 0.666
		}},
	)
	return out
}

// edgeScenarios are the corners where a stored state and the request
// disagree: many entries in one µs, rates finer than a µs, a clock that
// stepped back, a limit lowered or raised on a key that already has state.
func edgeScenarios() []scenario {
	second := time.Second
	perMinute := func(a tollgate.Algorithm, rate int) tollgate.Limit {
		return tollgate.Limit{Algorithm: a, Rate: rate, Period: time.Minute, Burst: rate}
	}
	// A sliding window log numbers the entries of one µs: the eleventh and
	// later must not overwrite earlier ones.
	var crowd []step
	crowd = append(crowd, allow(30*second, 11, 9, time.Minute))
	for left := 8; left >= 0; left-- {
		crowd = append(crowd, allow(30*second, 1, left, time.Minute))
	}
	for range 3 {
		crowd = append(crowd, deny(30*second, 1, 0, time.Minute, time.Minute))
	}
	out := []scenario{
		// The costliest decisions a log allows: MaxLogRate entries at once,
		// into an empty log, into one that just left the window whole, and
		// into one that left it all but one entry.
		{name: "sliding log at MaxLogRate", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: tollgate.MaxLogRate, Period: 10 * second}, steps: []step{
			allow(0, tollgate.MaxLogRate, 0, 10*second),
			deny(0, 1, 0, 10*second, 10*second),
			allow(10*second, tollgate.MaxLogRate-1, 1, 10*second),
			allow(11*second, 1, 0, 10*second),
			deny(11*second, 1, 0, 9*second, 10*second),
			allow(20*second, tollgate.MaxLogRate-1, 0, 10*second),
			deny(20*second, 1, 0, 1*second, 10*second),
		}},
		{name: "sliding log many in one microsecond", limit: perMinute(tollgate.SlidingWindowLog, 20), steps: crowd},
		// A shaper's Delay counts the lag of a clock that stepped back, and
		// never exceeds MaxDelay: 1/s, burst 1, up to 5s of delay.
		{name: "shaping clock goes backwards", limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: second, Burst: 1, MaxDelay: 5 * second}, steps: []step{
			shaped(10*second, 1, 0, 0, second),
			shaped(8*second, 1, 0, 3*second, 4*second), // 2s of lag + 1s
			shaped(8*second, 1, 0, 4*second, 5*second),
			shaped(8*second, 1, 0, 5*second, 6*second),
			deny(8*second, 1, 0, second, 6*second), // 6s: one second too many
			deny(9*second-us, 1, 0, us, 5*second+us),
			shaped(9*second, 1, 0, 5*second, 6*second),
		}},
		// Capacity is what an empty shaper admits at once: 2/s, burst 1, 1s
		// of delay is 3, the last one a full MaxDelay late.
		{name: "shaping capacity", limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: second, Burst: 1, MaxDelay: second}, steps: []step{
			shaped(20*second, 3, 0, second, 1500*ms),
			deny(19*second, 1, 0, 1500*ms, 2500*ms), // a second back: 2.5s of delay
			deny(20500*ms-us, 1, 0, us, second+us),
			shaped(20500*ms, 1, 0, second, 1500*ms),
		}},
		// 2,000,000 per second is one per 0.5µs: GCRA counts half µs. (A
		// burst of a second's worth keeps the Redis TTLs long.)
		{name: "sub-microsecond interval", limit: tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 2_000_000, Period: second, Burst: 2_000_000}, steps: []step{
			allow(0, 2_000_000, 0, second),
			deny(0, 1, 0, 1*us, second),
			allow(1*us, 2, 0, second),
			allow(2*us, 1, 1, second), // full again at 1,000,001.5µs: reset rounds up
			deny(2*us, 4, 1, 2*us, second),
			allow(3*us, 3, 0, second),
		}},
		// 3 per 10s leaves a third of a µs in the TAT; at 7 per 10s that
		// fraction becomes 3 sevenths (rounded up, never more lenient).
		{name: "rate raised converts the fraction", limit: tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 3, Period: 10 * second, Burst: 3}, steps: []step{
			allow(0, 1, 2, 3333334*us),
			under(tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 7, Period: 10 * second, Burst: 3}, peek(0, 0, 3333334*us)),
			under(tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 7, Period: 10 * second, Burst: 3}, deny(0, 1, 0, 476191*us, 3333334*us)),
			under(tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 7, Period: 10 * second, Burst: 3}, allow(476191*us, 1, 0, 4285714*us)),
		}},
		// Lowering a limit can leave a key far over it: a look still only
		// looks, and the next request waits exactly as long as needed.
		{name: "look after the limit was lowered", limit: perMinute(tollgate.FixedWindow, 10), steps: []step{
			allow(0, 8, 2, time.Minute),
			under(perMinute(tollgate.FixedWindow, 2), peek(0, 0, time.Minute)),
			under(perMinute(tollgate.FixedWindow, 2), deny(0, 1, 0, time.Minute, time.Minute)),
		}},
		{name: "look after the limit was lowered", limit: perMinute(tollgate.SlidingWindowLog, 10), steps: []step{
			allow(0, 8, 2, time.Minute),
			under(perMinute(tollgate.SlidingWindowLog, 2), peek(0, 0, time.Minute)),
			under(perMinute(tollgate.SlidingWindowLog, 2), deny(0, 1, 0, time.Minute, time.Minute)),
		}},
		{name: "look after the limit was lowered", limit: perMinute(tollgate.SlidingWindowCounter, 10), steps: []step{
			allow(0, 8, 2, 2*time.Minute),
			under(perMinute(tollgate.SlidingWindowCounter, 2), peek(0, 0, 2*time.Minute)),
			// In the next window the 8 weigh little enough 52.5s in.
			under(perMinute(tollgate.SlidingWindowCounter, 2), deny(0, 1, 0, 112500*ms, 2*time.Minute)),
		}},
		{name: "look after the limit was lowered", limit: perMinute(tollgate.LeakyBucket, 10), steps: []step{
			allow(0, 8, 2, 48*second),
			// The level of 8 is converted to the new rate's unit and
			// clamped to the 2 the bucket now holds, which drain in 60s.
			under(perMinute(tollgate.LeakyBucket, 2), peek(0, 0, 60*second)),
			under(perMinute(tollgate.LeakyBucket, 2), deny(0, 1, 0, 30*second, 60*second)),
		}},
		{name: "look after the clock went backwards", limit: with(bucket, tollgate.GCRA), steps: []step{
			allow(10*second, 5, 0, 2500*ms),
			peek(10*second-time.Hour, 0, time.Hour+2500*ms),
			deny(10*second-time.Hour, 1, 0, time.Hour+500*ms, time.Hour+2500*ms),
		}},
		{name: "look after the clock went backwards", limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: second, Burst: 1, MaxDelay: second}, steps: []step{
			shaped(10*second, 1, 0, 0, 500*ms),
			shaped(10*second, 1, 0, 500*ms, 1000*ms),
			peek(9*second, 0, 2000*ms), // nothing is sent, so nothing is delayed
		}},
	}
	// A state is kept until it is back to full under the limit that wrote
	// it; after that every store decides as for a fresh key, full under the
	// limit of the day — also when that limit has a larger burst.
	tiny := tollgate.Limit{Rate: 1, Period: 10 * ms, Burst: 1}
	raised := tollgate.Limit{Rate: 1, Period: 10 * ms, Burst: 5}
	expired := allow(20*ms, 1, 4, 10*ms)
	expired.wait = 50 * ms
	out = append(out, scenario{name: "burst raised after the state expired", limit: tiny, steps: []step{
		allow(0, 1, 0, 10*ms),
		under(raised, expired),
	}})
	// A bucket whose units nearly reach 2^53 (see its scenario below).
	nearMax := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 900_719_923, Period: 10 * second, Burst: 900_719_923}
	// A leaky bucket per 1,000,003µs (see its scenario below).
	prime := func(rate, burst int, maxDelay time.Duration) tollgate.Limit {
		return tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: rate, Period: 1_000_003 * us, Burst: burst, MaxDelay: maxDelay}
	}
	// A shaper, a bucket of its unit that fills fast, and the first and
	// last instants a decision may be made at (see their scenario below),
	// the last one 229 years from T0.
	ends := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: 1 << 45 * us, Burst: 2, MaxDelay: 1 << 46 * us}
	fill := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1<<20 + 1, Period: 1 << 45 * us, Burst: 255}
	lastUS := time.UnixMicro(exact.MaxNow).Sub(T0)
	firstUS := time.UnixMicro(1).Sub(T0)
	// A leaky bucket of rate per 125 days (see its scenario below).
	centuries := func(rate, burst int) tollgate.Limit {
		return tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: rate, Period: 10802237922549 * us, Burst: burst}
	}
	// A rate change converts what a key holds to the new unit exactly. 498
	// millionths of a token at 1/s are 249 of the 500,000 units a token has
	// at 2/s (a double computes 248.99999999999997), and a level of
	// 1,048,574 is 524,287 (a double: 524,286.99999999994).
	slow := tollgate.Limit{Rate: 1, Period: second, Burst: 2}
	fast := tollgate.Limit{Rate: 2, Period: second, Burst: 2}
	out = append(out,
		scenario{name: "rate raised rescales exactly", limit: slow, steps: []step{
			allow(0, 1, 1, second),
			allow(498*us, 1, 0, 2*second-498*us), // 498 units refilled
			under(fast, deny(498*us, 1, 0, 499751*us, 999751*us)),
			under(fast, allow(500249*us, 1, 0, second)),
		}},
		scenario{name: "rate raised rescales exactly", limit: with(slow, tollgate.LeakyBucket), steps: []step{
			allow(0, 1, 1, second),
			allow(951426*us, 1, 0, 1048574*us),
			under(with(fast, tollgate.LeakyBucket), deny(951426*us, 1, 0, 24287*us, 524287*us)),
			under(with(fast, tollgate.LeakyBucket), allow(975713*us, 1, 0, second)),
		}},
		// Rounded down, as tokens are: 1,048,575 units at 1/s are 524,287.5
		// at 2/s, kept as 524,287.
		scenario{name: "rate raised rescales rounding down", limit: with(slow, tollgate.LeakyBucket), steps: []step{
			allow(0, 1, 1, second),
			allow(951425*us, 1, 0, 1048575*us),
			under(with(fast, tollgate.LeakyBucket), deny(951425*us, 1, 0, 24287*us, 524287*us)),
		}},
		// A period of 10,802,237,922,549µs (125 days), which the prime
		// 99,991 does not divide: at 99,991 and at 1 per period a token is
		// the same number of units, the period's µs, so a level written at
		// 99,991 (833 tokens, 25h of draining) is read whole at 1, where
		// it would drain in 285 years, more µs than a double counts
		// exactly. Every read caps a level at what drains in 2^47µs (about
		// 4.5 years) under the reading limit: here 2^47 =
		// 140,737,488,355,328 units, read 10,001h before the write.
		scenario{name: "level capped under a far slower rate", limit: centuries(99_991, 833), steps: []step{
			allow(0, 833, 0, 89990741062*us),
			under(centuries(1, 1), peek(-10001*time.Hour, 0, 176741088355328*us)),
			under(centuries(1, 1), deny(-10001*time.Hour, 1, 0, 176741088355328*us, 176741088355328*us)),
			// The same read an hour on, the clock still 10,000h back.
			under(centuries(1, 1), peek(-10000*time.Hour, 0, 176737488355328*us)),
		}},
		// The token bucket and GCRA under the same change keep no amount
		// that a slower rate turns into centuries: the token bucket reads
		// its tokens (none left) clamped to this limit's burst and debt,
		// so its durations are the lag plus one period; GCRA keeps a time,
		// 833 intervals of 99,991 per period on (rounded up to a whole µs
		// under the slower rate), plus the lag.
		scenario{name: "tokens under a far slower rate", limit: with(centuries(99_991, 833), tollgate.TokenBucket), steps: []step{
			allow(0, 833, 0, 89990741062*us),
			under(with(centuries(1, 1), tollgate.TokenBucket), peek(-10001*time.Hour, 0, 46805837922549*us)),
			under(with(centuries(1, 1), tollgate.TokenBucket), deny(-10001*time.Hour, 1, 0, 46805837922549*us, 46805837922549*us)),
		}},
		scenario{name: "arrival time under a far slower rate", limit: with(centuries(99_991, 833), tollgate.GCRA), steps: []step{
			allow(0, 833, 0, 89990741062*us),
			under(with(centuries(1, 1), tollgate.GCRA), peek(-10001*time.Hour, 0, 36093590741062*us)),
			under(with(centuries(1, 1), tollgate.GCRA), deny(-10001*time.Hour, 1, 0, 36093590741062*us, 36093590741062*us)),
		}},
		// A bucket of 9,007,199,230,000,000 units, just below 2^53: 10^7
		// per token at 900,719,923 per 10s, a burst of as many. Emptied,
		// it is full again in exactly 10s; a ceiling of doubles would
		// divide 10^7 + 1 times the rate, less 1, past 2^53 and rounded up
		// to the next multiple of the rate.
		scenario{name: "ceiling near 2^53", limit: nearMax, steps: []step{
			allow(0, nearMax.Burst, 0, 10*second),
			deny(0, 1, 0, us, 10*second),
			peek(0, 0, 10*second),
		}},
		scenario{name: "ceiling near 2^53", limit: with(nearMax, tollgate.LeakyBucket), steps: []step{
			allow(0, nearMax.Burst, 0, 10*second),
			deny(0, 1, 0, us, 10*second),
			peek(0, 0, 10*second),
		}},
		// A level just below 2^53 units, read whole under two other rates
		// of its unit (the period's 1,000,003µs, a prime): 9,007,172,233
		// tokens at 10^6 per period, the most a bucket may hold, fill it
		// to 9,007,199,254,516,699 units, 73,000,219 times 123,385,921. At
		// 123,385,921 per period that drains in 73,000,219µs exactly,
		// though level + 123,385,920, the sum a ceiling of doubles would
		// divide, rounds up past 2^53 to the next multiple. A shaper of 128 per period with the longest delay its
		// burst of 1 allows, 70,368,744,169,851µs, is asked for 13: the
		// excess, level + 12 periods, passes 2^53 itself, and the wait,
		// 70,368,744,269,662µs, is 99,811µs too long.
		scenario{name: "level near 2^53 read under other rates", limit: prime(1_000_000, 9_007_172_233, 0), steps: []step{
			allow(0, 9_007_172_233, 0, 9007199255*us),
			under(prime(123_385_921, 1, 0), peek(0, 0, 73000219*us)),
			under(prime(128, 1, 70368744169851*us), deny(0, 13, 0, 99811*us, 70368744175912*us)),
		}},
		// The longest durations there are: a bucket filled at the latest
		// valid time (exact.MaxNow) at 1,048,577 per 2^45µs, 255 tokens
		// (2.4h of draining), is read 1µs after 1970 by a shaper of 1 per
		// 2^45µs, burst 2, up to 2^46µs of delay: the same unit, so its
		// level is read whole and capped at 2^47µs of draining. Then 4
		// more would wait the lag, 2^53 − 2^47 − 1µs, plus 3 × 2^46µs,
		// beyond 2^53; less the delay allowed, RetryAfter is 2^53 − 1µs.
		scenario{name: "shaping at the ends of time", limit: fill, steps: []step{
			allow(lastUS, 255, 0, 8556372001*us),
			under(ends, deny(firstUS, 4, 0, 9007199254740991*us, 9007199254740991*us)),
			under(ends, peek(firstUS, 0, 9007199254740991*us)),
		}},
	)
	return out
}
