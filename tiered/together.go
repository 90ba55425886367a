package tiered

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

var _ tollgate.Combiner = (*Store)(nil)

// AllowAll implements tollgate.Combiner through the global store, which
// must be a tollgate.Combiner itself (redisstore and memorystore are): the
// set is decided in one global call, through the breaker and bounded by the
// store's timeout as AllowN's calls are. Over a global store that is not,
// every set fails, so a middleware rule of several policies answers by its
// failure mode: its policies are decided together only over a Combiner.
//
// The local tier answers none of it. A remembered denial is one limit's,
// and the set needs every limit's Result; a lease holds tokens of one limit
// that the others never counted. So every AllowAll is a global call. Its
// answer is remembered per limit as AllowN's is (each limit's Result is
// the one AllowN would have given it, at the set's cost or, for a limit
// that only looked, at 0), so that an admission forgets the denials it
// made too short and a denial can answer the key's next single requests
// locally. When the global store fails, degraded mode decides the set in
// the local memorystore at each limit's local share, all or nothing as
// well.
func (s *Store) AllowAll(ctx context.Context, key string, limits []tollgate.Limit, n int, dst []tollgate.Result) ([]tollgate.Result, error) {
	var pbuf [4]tollgate.Params
	ps, err := tollgate.CheckAll(key, limits, n, pbuf[:0])
	if err != nil {
		return dst, fmt.Errorf("tiered: %w", err)
	}
	g, ok := s.global.(tollgate.Combiner)
	if !ok {
		return dst, fmt.Errorf("tiered: the global store %T cannot decide limits together", s.global)
	}
	if err := ctx.Err(); err != nil {
		return dst, fmt.Errorf("tiered: %w", err)
	}
	now := s.now()
	ok, probe := s.breaker.allow(now)
	if !ok {
		return s.decideAllLocally(key, limits, n, now, errBreakerOpen, dst)
	}
	start := len(dst)
	_, err = s.callGlobalWith(ctx, limits[0], probe, func(ctx context.Context) (tollgate.Result, error) {
		var err error
		dst, err = g.AllowAll(ctx, key, limits, n, dst[:start])
		return tollgate.Result{}, err
	})
	switch {
	case errors.Is(err, errCallerGone):
		return dst[:start], fmt.Errorf("tiered: %w", ctx.Err())
	case isInputError(err):
		return dst[:start], err
	case err != nil:
		return s.decideAllLocally(key, limits, n, now, err, dst[:start])
	}
	// Each limit's Result is what AllowN would have answered it, at the
	// set's cost (spent or denied) or at 0 (a look): remembered as that.
	rs := dst[start:]
	all := admitted(rs)
	for i, r := range rs {
		cost := n
		if !all && r.Allowed {
			cost = 0
		}
		s.remember(keyOf(key, limits[i]), &ps[i], limits[i], cost, r, now)
	}
	return dst, nil
}

// decideAllLocally makes a degraded-mode decision of a set, or returns the
// failure when degraded mode is off. A limit whose local share can never
// admit n denies until the global store may be back, and the others look.
func (s *Store) decideAllLocally(key string, limits []tollgate.Limit, n int, now time.Time, cause error, dst []tollgate.Result) ([]tollgate.Result, error) {
	if !s.degraded {
		return dst, fmt.Errorf("tiered: %w", cause)
	}
	var lbuf [4]tollgate.Limit
	local := lbuf[:0]
	cost := n
	for _, l := range limits {
		l = s.localLimit(l)
		if n > l.Capacity() {
			cost = 0
		}
		local = append(local, l)
	}
	start := len(dst)
	dst, err := s.local.AllowAll(context.Background(), key, local, cost, dst)
	if err != nil {
		return dst[:start], fmt.Errorf("tiered: degraded limits %v for %v: %w (global store: %w)", local, limits, err, cause)
	}
	if cost != n {
		retry := max(s.breaker.retryIn(now), time.Microsecond)
		for i, l := range local {
			if n > l.Capacity() {
				dst[start+i] = tollgate.Result{Limit: l, RetryAfter: retry}
			}
		}
	}
	s.stats.degraded.Add(1)
	return dst, nil
}

// admitted reports whether a set's Results admitted the request.
func admitted(rs []tollgate.Result) bool {
	for _, r := range rs {
		if !r.Allowed {
			return false
		}
	}
	return true
}
