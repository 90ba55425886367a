package tollgate

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/store/exact"
)

// Settler is a Store that can correct what a key spent once a request's real
// cost is known: reserve an estimate when the request is admitted, settle
// the actual cost when the response is done. An LLM completion is billed in
// tokens counted only at its end; so are bytes served, rows scanned or GPU
// seconds. Reserving an estimate keeps a tenant from starting more work
// than its limit allows; settling makes the limit count what was really
// used — a refund when the request cost less, an extra charge when it cost
// more, a full refund when it should not count at all (a 5xx the client did
// not cause).
//
// Settling is one atomic correction of the key's state at the time of the
// settle, under the reservation's limit, by what each algorithm can express:
//
//   - TokenBucket, GCRA and LeakyBucket refund by giving tokens back (never
//     above a full bucket: a key cannot be owed more than its Burst), and
//     charge extra by taking tokens, below zero if need be: the key then
//     owes a debt that the next requests wait out. A key owes at most
//     Params.MaxDebt (one Capacity, less for limits whose doubled state
//     would not count exactly); a charge beyond it is not recorded.
//   - FixedWindow and SlidingWindowCounter refund to the window the
//     reservation counted in, while that window still counts (the current
//     one, or for the counter the previous one, which still weighs); a
//     refund into a window that no longer counts changes nothing. An extra
//     charge counts in the window current at the settle, the cost having
//     been incurred then, and may take the window's count up to Rate plus
//     MaxDebt, which denies the rest of that window.
//   - SlidingWindowLog refunds by removing the reservation's own entries
//     (those made at its instant) still in the log, and charges extra by
//     adding entries at the settle's instant, up to Rate plus MaxDebt
//     entries in the log.
//
// An extra charge never lowers what a key has spent, nor a refund raise it:
// when a lowered limit leaves a key above its new cap, a charge leaves it
// there. A token bucket's debt is at most the MaxDebt of the limit a call
// is made under (a lower one forgives the rest), and a changed rate
// converts it as it converts tokens, rounding down; a leaky bucket's level
// under a changed rate is clamped, as always, to Burst and what MaxDelay
// queues, which forgives a debt beyond it.
//
// A settle writes the key's state and its expiry as an admission does (kept
// until full again). A settle that changes nothing — an actual cost equal to
// the estimate, a refund that finds no live state, or no window or entries
// of the reservation's — is a look (AllowN with n = 0), in what it reports
// and in the expiry it sets. Settling after the key's state expired is
// harmless: a refund into a full key does nothing, an extra charge starts a
// debt. A look at a key in debt is allowed, with a Remaining of 0. A
// reservation's instant is the store's clock at its decision, not the key's
// time: one admitted while the clock stood behind the key's newer window or
// log entries was counted there, and a refund does not find it. The Reservation returned by
// Limiter.Reserve settles at most once; stores themselves do not remember
// reservations, so a reservation's data settled twice by hand is counted
// twice.
//
// memorystore.Store and redisstore.Store implement it, and tiered.Store
// through its global store.
type Settler interface {
	Store
	// ReserveN decides exactly as AllowN(ctx, key, limit, n) does, and
	// also returns the store's clock at the decision, in µs since the Unix
	// epoch (the Redis server's, for redisstore): the instant SettleN
	// needs to find the reservation's window or entries.
	ReserveN(ctx context.Context, key string, limit Limit, n int) (Result, int64, error)
	// SettleN corrects key's state under limit by actual − reserved, for a
	// reservation of cost reserved admitted at the store's clock at, as
	// the Settler doc says for each algorithm, and returns the key's state
	// after the correction as a look (n = 0) reports it. reserved 0 is a
	// charge of actual with no reservation before it (a cost reported
	// after the fact, such as a gateway's stream-done hits); at is then
	// not used. Implementations check their arguments with CheckSettle
	// first.
	SettleN(ctx context.Context, key string, limit Limit, at int64, reserved, actual int) (Result, error)
}

// ErrSettled: the reservation was already settled (or refunded); the second
// settle changed nothing.
var ErrSettled = errors.New("tollgate: reservation already settled")

// Reservation is an admitted estimate waiting for the request's real cost.
// It is safe for concurrent use, and settles at most once.
type Reservation struct {
	// Result is the admission decision. A denied reservation spent nothing,
	// and settling it does nothing.
	Result
	// Key is the key the estimate was reserved on.
	Key string
	// Cost is the estimate reserved.
	Cost int

	at      int64
	store   Settler
	timeout time.Duration
	settled atomic.Bool
}

// Reserve admits or denies a request of estimated cost on key under limit,
// exactly as AllowN would, and returns the Reservation to settle once the
// real cost is known. The store must be a Settler (memorystore and
// redisstore are); with another it fails with an error naming the store.
func (l *Limiter) Reserve(ctx context.Context, key string, limit Limit, estimate int) (*Reservation, error) {
	s, ok := l.store.(Settler)
	if !ok {
		return nil, fmt.Errorf("tollgate: %T cannot settle reservations", l.store)
	}
	if estimate < 1 {
		return nil, fmt.Errorf("%w: an estimate must be at least 1, got %d", ErrInvalidCost, estimate)
	}
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	res, at, err := s.ReserveN(ctx, key, limit, estimate)
	if err != nil {
		return nil, err
	}
	return &Reservation{Result: res, Key: key, Cost: estimate, at: at, store: s, timeout: l.timeout}, nil
}

// Settle corrects the key by actual − Cost: a refund when the request cost
// less than its estimate, an extra charge when it cost more (see Settler for
// what each algorithm does). It returns the key's state after the
// correction. Settle(ctx, 0) gives the whole estimate back, as if the
// request had never been admitted, by the algorithms that can say so.
//
// A second Settle returns ErrSettled and changes nothing. A Settle of a
// denied reservation, which spent nothing, changes nothing either and
// returns its Result, with no error. A negative actual is ErrInvalidCost,
// and the reservation stays unsettled. A store that fails leaves the reservation settled, the
// correction perhaps not made: a retry could count it twice.
//
// Give it a context the end of the request does not cancel
// (context.WithoutCancel), or a remote store cannot be told.
func (r *Reservation) Settle(ctx context.Context, actual int) (Result, error) {
	if actual < 0 {
		return r.Result, fmt.Errorf("%w: an actual cost must be at least 0, got %d", ErrInvalidCost, actual)
	}
	if !r.Allowed {
		return r.Result, nil
	}
	if !r.settled.CompareAndSwap(false, true) {
		return r.Result, ErrSettled
	}
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	return r.store.SettleN(ctx, r.Key, r.Limit, r.at, r.Cost, actual)
}

// CheckSettle validates a SettleN the way every Settler does before it
// touches any state, and returns the limit's Params and the correction to
// make, actual − reserved, bounded: a refund of at most reserved, a charge
// of at most Capacity + MaxDebt (no settle can take more than that from a
// key). The key and limit are checked as CheckRequest checks them, reserved
// must be 0 to Capacity (ErrInvalidCost, ErrCostExceedsBurst), actual at
// least 0 (ErrInvalidCost) and at a time a decision could have been made at.
func CheckSettle(key string, l Limit, at int64, reserved, actual int) (Params, int64, error) {
	p, err := CheckRequest(key, l, reserved)
	if err != nil {
		return p, 0, err
	}
	if p.Calendar != nil {
		return p, 0, fmt.Errorf("%w: %s: settling is not supported under a calendar window", ErrInvalidLimit, l)
	}
	if actual < 0 {
		return p, 0, fmt.Errorf("%w: an actual cost must be at least 0, got %d", ErrInvalidCost, actual)
	}
	if at < 0 || at > exact.MaxNow {
		return p, 0, fmt.Errorf("%w: reserved at %d µs, outside what a store can count exactly (1970 to 2250)", ErrInvalidCost, at)
	}
	return p, min(int64(actual), p.Capacity+p.MaxDebt+int64(reserved)) - int64(reserved), nil
}
