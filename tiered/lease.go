package tiered

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

// lease is a batch of tokens taken from the global store in one call and
// spent locally.
type lease struct {
	limit   tollgate.Limit
	left    int
	res     tollgate.Result // the global store's answer to the take
	at      time.Time
	expires time.Time
	// taking is, while a request of this instance is taking a lease for
	// the key, that request's ticket (never 0); the others then ask the
	// global store for their own cost only, so that concurrent requests do
	// not take K each (see claimTake).
	taking uint64
}

// leasable reports whether leases make sense for limit: where tokens are
// interchangeable and taking K now is the same as taking 1 K times
// (TokenBucket, GCRA, a policing LeakyBucket, FixedWindow within its
// window). Not for the sliding windows, whose point is when each request
// was made, nor for a shaping LeakyBucket, whose answer is a delay for each
// request.
func leasable(limit tollgate.Limit) bool {
	switch limit.Algorithm {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.FixedWindow:
		return true
	case tollgate.LeakyBucket:
		return limit.MaxDelay == 0
	}
	return false
}

// leaseCost is how many tokens a request of cost n takes from the global
// store when it takes a lease: K, or n when n is larger, and never more
// than the limit can admit at once.
func (s *Store) leaseCost(limit tollgate.Limit, n int) int {
	return max(n, min(s.leaseSize, limit.Capacity()))
}

// claimTake makes the calling request the one that takes the key's next
// lease, unless another request of this instance is already taking one. It
// returns the request's ticket, or 0. Without it, every request that finds
// the lease empty would take K tokens at once: the instance would hold
// several leases' worth (beyond the bound) or, kept to one, the rest would
// be taken from the global store for nothing.
func (s *Store) claimTake(k skey, limit tollgate.Limit, now time.Time) uint64 {
	ticket := s.tickets.Add(1)
	s.leases.update(k, now, func(l lease, found bool) (lease, bool) {
		fresh := found && l.limit == limit && now.Before(l.expires) && !now.Before(l.at)
		if fresh && l.taking != 0 {
			ticket = 0
			return l, true
		}
		if !fresh {
			l = lease{limit: limit, at: now, expires: now.Add(s.leaseTTL)}
		}
		l.taking = ticket
		return l, true
	})
	return ticket
}

// releaseTake ends the take of ticket, whatever its outcome.
func (s *Store) releaseTake(k skey, ticket uint64, now time.Time) {
	s.leases.update(k, now, func(l lease, found bool) (lease, bool) {
		if found && l.taking == ticket {
			l.taking = 0
		}
		return l, found && (l.left > 0 || l.taking != 0)
	})
}

// spendLease admits a request from the key's lease, if it holds enough.
func (s *Store) spendLease(k skey, limit tollgate.Limit, n int, now time.Time) (tollgate.Result, bool) {
	var res tollgate.Result
	var ok bool
	s.leases.update(k, now, func(l lease, found bool) (lease, bool) {
		if !found {
			return l, false
		}
		if l.limit != limit || !now.Before(l.expires) || now.Before(l.at) {
			return l, false // expired or for another limit: its tokens are lost
		}
		if l.left < n {
			return l, true
		}
		l.left -= n
		res, ok = l.result(now), true
		return l, l.left > 0 || l.taking != 0
	})
	if ok {
		s.stats.leaseHits.Add(1)
	}
	return res, ok
}

// result is what a decision admitted from the lease reports: the global
// store's Remaining when the lease was taken plus what the lease still
// holds, and its ResetAfter counted down.
func (l *lease) result(now time.Time) tollgate.Result {
	return tollgate.Result{
		Allowed:    true,
		Limit:      l.limit,
		Remaining:  l.res.Remaining + l.left,
		ResetAfter: max(l.res.ResetAfter-now.Sub(l.at).Truncate(time.Microsecond), 0),
	}
}

// leaseTaken handles the global store's answer to taking cost tokens for a
// request of n: admitted, the request spends n of them and the rest become
// the key's lease; denied, the denial is remembered and, unless it already
// shows that n would be denied too, n is asked for on its own.
func (s *Store) leaseTaken(ctx context.Context, k skey, p *tollgate.Params, key string, limit tollgate.Limit, n, cost int, res tollgate.Result, sent time.Time) (tollgate.Result, error) {
	if res.Allowed {
		s.stats.leasesTaken.Add(1)
		l := lease{limit: limit, left: cost - n, res: res, at: sent, expires: sent.Add(s.leaseTTL)}
		if limit.Algorithm == tollgate.FixedWindow {
			// Tokens of this window must not be spent in the next.
			if end := sent.Add(res.ResetAfter); end.Before(l.expires) {
				l.expires = end
			}
		}
		s.leases.update(k, sent, func(old lease, found bool) (lease, bool) {
			if found {
				l.taking = old.taking // released by the caller
			}
			if found && old.limit == limit && sent.Before(old.expires) {
				// What the previous lease still holds is kept, up to one
				// lease's worth: what an instance holds is what it can
				// admit beyond the limit, and the bound counts K per
				// instance. (Only one take is in flight at a time, so this
				// is at most K − 1 unless the entry was evicted meanwhile;
				// the rest is then lost.)
				l.left = min(l.left+old.left, s.leaseCost(limit, 1))
			}
			return l, true
		})
		s.denials.delete(k)
		return l.result(sent), nil
	}
	s.remember(k, p, limit, cost, res, sent)
	// The same answer may deny n too. (Not counted as a local denial: it
	// took a global call.)
	if e, ok := remember(p, limit, cost, res, sent); ok {
		if r, ok := e.deny(p, n, sent); ok {
			return r, nil
		}
	}
	ok, probe := s.breaker.allow(s.now())
	if !ok {
		return s.decideLocally(key, limit, n, s.now(), errBreakerOpen)
	}
	res, err := s.callGlobal(ctx, key, limit, n, sent, probe)
	if err != nil {
		if errors.Is(err, errCallerGone) {
			return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: %w", ctx.Err())
		}
		if isInputError(err) {
			return res, err
		}
		return s.decideLocally(key, limit, n, s.now(), err)
	}
	s.remember(k, p, limit, n, res, sent)
	return res, nil
}
