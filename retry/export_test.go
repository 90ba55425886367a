package retry

import "time"

// WithClock sets the clock (default time.Now) that an HTTP-date
// Retry-After is measured from.
func WithClock(now func() time.Time) Option { return func(o *options) { o.t.now = now } }

// WithRandom replaces the jitter's randomness: random(n) returns a number in
// [0, n) (default math/rand/v2.Int64N).
func WithRandom(random func(n int64) int64) Option { return func(o *options) { o.t.random = random } }
