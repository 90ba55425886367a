package tollgate

import (
	"context"
	"fmt"
	"time"
)

// A Combiner is a Store that can also decide several limits on one key as a
// single decision, all or nothing: a plan's 10 a second and 10,000 a day,
// say, where a request the daily quota denies must not spend the per-second
// allowance, nor the other way round.
//
// AllowAll decides n under every one of limits at one instant, atomically
// as one AllowN is:
//
//   - when each limit alone would admit n, each spends it, and each Result
//     is that limit's admission;
//   - otherwise none spends anything. Each limit that would deny reports its
//     denial (its RetryAfter is when it would admit, if nothing else spends
//     meanwhile), and each that would admit reports a look (n = 0: Allowed,
//     with what it has left, unspent).
//
// So the request was admitted exactly when every Result is Allowed, and the
// longest RetryAfter among them is when it would be. n = 0 looks at every
// limit. A limit keeps its state per key, algorithm and period (or
// calendar), as AllowN does, so a limit decides the same whether it is
// asked alone or together with others: a key can be asked of one limit by
// AllowN and of a set by AllowAll, and both see one count.
//
// AllowAll appends one Result per limit, in order, to dst and returns it.
// Implementations check the request with CheckAll before touching any
// state: invalid input changes nothing, and a cost above any limit's
// Capacity is ErrCostExceedsBurst, for no wait would let it through.
//
// memorystore.Store and redisstore.Store implement it (on Redis, one script
// call whose keys share the key's hash tag, so one Cluster slot), and
// tiered.Store through its global store.
type Combiner interface {
	Store
	AllowAll(ctx context.Context, key string, limits []Limit, n int, dst []Result) ([]Result, error)
}

// maxLimits is the most limits one AllowAll takes: a plan is a few limits,
// and each costs the store a decision.
const maxLimits = 16

// CheckAll validates a request of AllowAll — the key, 1 to 16 limits of
// which no two share a state (the same algorithm and period, or
// calendar), and a cost every limit can admit — as every Combiner does
// before it touches any state, and appends each limit's Params to dst.
// Its errors are CheckRequest's, and ErrInvalidLimit for the set.
func CheckAll(key string, limits []Limit, n int, dst []Params) ([]Params, error) {
	if len(limits) == 0 || len(limits) > maxLimits {
		return dst, fmt.Errorf("%w: decide 1 to %d limits together, got %d", ErrInvalidLimit, maxLimits, len(limits))
	}
	for i, l := range limits {
		p, err := CheckRequest(key, l, n)
		if err != nil {
			return dst, err
		}
		for j, o := range limits[:i] {
			if o.Algorithm == l.Algorithm && o.Period == l.Period && o.Calendar == l.Calendar {
				return dst, fmt.Errorf("%w: limits %d (%v) and %d (%v) would share one state: give them different algorithms or periods", ErrInvalidLimit, j, o, i, l)
			}
		}
		dst = append(dst, p)
	}
	return dst, nil
}

// AllowAll decides whether key may spend n (at least 1) under every one of
// limits, and spends it under all of them if so, or under none: see
// Combiner. The store must be a Combiner (memorystore, redisstore and
// tiered are).
//
// The Result is the limit that decided. When the request was denied, it
// is the denying limit with the longest RetryAfter, so that waiting it out
// is enough unless others spend meanwhile; when it was admitted, the limit
// with the least Remaining, whose headers a response should carry. Its
// Delay is the longest of the limits' (shaping leaky buckets). To see
// every limit's Result, call the store's AllowAll.
func (l *Limiter) AllowAll(ctx context.Context, key string, limits []Limit, n int) (Result, error) {
	var first Limit
	if len(limits) > 0 {
		first = limits[0]
	}
	if n < 1 {
		return Result{Limit: first}, fmt.Errorf("%w: cost must be at least 1, got %d", ErrInvalidCost, n)
	}
	c, ok := l.store.(Combiner)
	if !ok {
		return Result{Limit: first}, fmt.Errorf("tollgate: %T cannot decide limits together (it is no Combiner)", l.store)
	}
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	var buf [4]Result
	rs, err := c.AllowAll(ctx, key, limits, n, buf[:0])
	if err != nil {
		return Result{Limit: first}, err
	}
	return decided(rs), nil
}

// decided returns the Result of the limit that decided a set (see
// Limiter.AllowAll), carrying the longest Delay.
func decided(rs []Result) Result {
	b := 0
	var delay time.Duration
	for i, r := range rs {
		delay = max(delay, r.Delay)
		switch d := rs[b]; {
		case r.Allowed != d.Allowed:
			if !r.Allowed {
				b = i
			}
		case !r.Allowed:
			if r.RetryAfter > d.RetryAfter {
				b = i
			}
		case r.Remaining < d.Remaining:
			b = i
		}
	}
	r := rs[b]
	r.Delay = delay
	return r
}
