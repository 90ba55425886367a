package tiered

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

var _ tollgate.Settler = (*Store)(nil)

// ReserveN implements tollgate.Settler through the global store, which must
// be a tollgate.Settler itself (redisstore is): a reservation is settled
// later against the state that admitted it, so only the global store can
// make it. The denial cache answers as for AllowN (a denied reservation has
// nothing to settle); leases are not used, since their tokens were counted
// at another instant than the reservation's; and there is no degraded mode:
// a reservation the global store cannot make fails, and the caller's
// failure mode answers, rather than one made locally that no settle could
// find.
func (s *Store) ReserveN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, int64, error) {
	g, err := s.settler()
	if err != nil {
		return tollgate.Result{Limit: limit}, 0, err
	}
	p, err := tollgate.CheckRequest(key, limit, n)
	if err != nil {
		return tollgate.Result{Limit: limit}, 0, fmt.Errorf("tiered: %w", err)
	}
	k, now := keyOf(key, limit), s.now()
	if n > 0 {
		if res, ok := s.cachedDenial(k, &p, limit, n, now); ok {
			return res, 0, nil
		}
	}
	var at int64
	res, err := s.globalCall(ctx, limit, now, func(ctx context.Context) (res tollgate.Result, err error) {
		res, at, err = g.ReserveN(ctx, key, limit, n)
		return res, err
	})
	if err != nil {
		return res, 0, err
	}
	s.remember(k, &p, limit, n, res, now)
	return res, at, nil
}

// SettleN implements tollgate.Settler in the global store, which must be a
// tollgate.Settler itself. With WithDenialCache it refuses a refund (an
// actual cost below the reserved one), which the other instances' denial
// caches would not see, and forgets the key's remembered denial after a
// charge, whose RetryAfter is longer than the remembered one.
func (s *Store) SettleN(ctx context.Context, key string, limit tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, error) {
	g, err := s.settler()
	if err != nil {
		return tollgate.Result{Limit: limit}, err
	}
	_, d, err := tollgate.CheckSettle(key, limit, at, reserved, actual)
	if err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: %w", err)
	}
	if d < 0 && s.cache {
		return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: a refund of %d (reserved %d, actual %d) on a store with a denial cache, which other instances' caches would not see (see WithDenialCache)", -d, reserved, actual)
	}
	res, err := s.globalCall(ctx, limit, s.now(), func(ctx context.Context) (tollgate.Result, error) {
		return g.SettleN(ctx, key, limit, at, reserved, actual)
	})
	if err == nil {
		s.denials.delete(keyOf(key, limit))
	}
	return res, err
}

func (s *Store) settler() (tollgate.Settler, error) {
	g, ok := s.global.(tollgate.Settler)
	if !ok {
		return nil, fmt.Errorf("tiered: the global store %T cannot settle reservations", s.global)
	}
	return g, nil
}

// globalCall makes a call other than AllowN to the global store, through
// the breaker and bounded by the store's timeout, as callGlobal does; an
// open breaker or a failure is the call's error (no degraded mode).
func (s *Store) globalCall(ctx context.Context, limit tollgate.Limit, now time.Time, call func(context.Context) (tollgate.Result, error)) (tollgate.Result, error) {
	ok, probe := s.breaker.allow(now)
	if !ok {
		return tollgate.Result{Limit: limit}, errBreakerOpen
	}
	res, err := s.callGlobalWith(ctx, limit, probe, call)
	if err != nil {
		if err == errCallerGone {
			err = ctx.Err()
		}
		return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: %w", err)
	}
	return res, nil
}
