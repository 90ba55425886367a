// Package tollgate is a rate limiter for Go services whose replicas must
// share one limit.
//
// A limit that every replica checks with GET, compare, INCR is not a limit:
// two replicas read the same count and both pass, and a limiter in each
// pod's memory multiplies the limit by the number of pods. tollgate makes
// one atomic decision per request against one shared state — in Redis, a
// Lua script per algorithm, one round trip — and tells the caller exactly
// how much is left and when to come back.
//
// The pieces:
//
//   - Limit says how much: Rate per Period, a Burst, and one of six
//     algorithms (TokenBucket, the default; GCRA; FixedWindow;
//     SlidingWindowLog; SlidingWindowCounter; LeakyBucket, which can also
//     shape traffic by delaying instead of rejecting).
//   - Store keeps the state and decides: redisstore for a limit shared by
//     every replica, memorystore for one process. Both run the same
//     algorithms in the same integer arithmetic and decide identically.
//   - Limiter is what callers use: Allow and AllowN on the request path,
//     Wait and WaitN to stay under somebody else's quota, Peek and Reset.
//   - Result is the answer: Allowed, Remaining, RetryAfter, ResetAfter and,
//     for shaping, Delay. Being over the limit is a Result, never an error.
//   - ConcurrencyStore bounds how many requests run at once rather than how
//     many start per period: Acquire a Permit, Release it when done; a
//     permit whose holder died lapses after its lease.
//
// Around the core, sibling packages put limits in the request path
// (httplimit, grpclimit), on the client side (retry), and behind a gateway
// (the tollgate binary's serve command).
package tollgate
