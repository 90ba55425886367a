package tollgate

import (
	"context"
	"time"
)

// Result is the outcome of one decision: everything a response header or a
// retrying client needs.
type Result struct {
	// Allowed reports whether the request was admitted (and its cost spent).
	Allowed bool
	// Limit is the limit the decision was made under.
	Limit Limit
	// Remaining is how much cost the key may still spend right now, after
	// this decision: whole tokens for the bucket algorithms, requests left
	// in the window for the window algorithms.
	Remaining int
	// RetryAfter is, when the request was denied, how long until the same
	// request would be admitted; 0 when it was allowed. It is exact to the
	// microsecond: round it up, never down, when you print whole seconds.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is back to its full allowance if
	// nothing more is spent (and its stored state expires): 0 for a key
	// that has spent nothing.
	ResetAfter time.Duration
	// Delay is, for a shaping LeakyBucket, how long the admitted request
	// must wait before it goes; 0 otherwise.
	Delay time.Duration
}

// Store keeps the state of every key and makes decisions against it. Each
// call is one atomic decision: for a given key, concurrent calls — from this
// process or from any other sharing the store — behave as if made one after
// the other. Policy (which key, which limit, what to do when the store
// fails) belongs to the caller; a Store only counts.
//
// Implementations check every request with CheckRequest before touching any
// state, so an invalid key, limit or cost changes nothing, and decide with
// the Params it returns. Both live here, beside the interface, rather than
// in an internal package: a Store written outside this module (another
// database) must refuse and reduce limits exactly as memorystore and
// redisstore do, and could not import an internal package.
type Store interface {
	// AllowN decides whether key may spend n under limit now, and spends it
	// if so. n == 0 spends nothing and reports the key's state (the Result
	// is then always Allowed). Being over the limit is a Result with
	// Allowed false, not an error; errors are for invalid input and for a
	// store that cannot answer.
	AllowN(ctx context.Context, key string, limit Limit, n int) (Result, error)
	// Reset forgets what key has spent under limit (its algorithm and
	// period), as if it had never been seen.
	Reset(ctx context.Context, key string, limit Limit) error
}
