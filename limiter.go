package tollgate

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limiter makes rate-limit decisions against a Store. It holds no per-key
// state — the Store does — and no configuration per key: the Limit is an
// argument of every call. A Limiter is safe for concurrent use; make one per
// Store and share it.
//
// Most callers want Allow (or AllowN for requests that cost more than one)
// on the request path, and Wait on the client side to stay under somebody
// else's quota.
type Limiter struct {
	store   Store
	timeout time.Duration
	// door is what a decision is asked of: the store, or under WithTimeout
	// the store within its deadline. It is chosen once, in New, so that
	// Allow makes a single call and is inlined into its caller: a frame
	// between the caller and the store copied the Result twice.
	door allower
}

// allower is the part of a Store that decides.
type allower interface {
	AllowN(ctx context.Context, key string, limit Limit, n int) (Result, error)
}

// Option configures a Limiter.
type Option func(*options)

// options are what the Options set: the Limiter being made.
type options struct{ l Limiter }

// WithTimeout bounds every store call with a deadline of d, on top of the
// caller's context, so that a slow store cannot hold the caller longer.
// 0 (the default) leaves the caller's context alone.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.l.timeout = d }
}

// New returns a Limiter deciding against store: redisstore.New for a limit
// shared by every replica, memorystore.New for one process.
func New(store Store, opts ...Option) *Limiter {
	o := options{l: Limiter{store: store}}
	for _, opt := range opts {
		opt(&o)
	}
	l := &o.l
	l.door = store
	if l.timeout > 0 {
		l.door = within{l}
	}
	return l
}

// Allow is AllowN(ctx, key, limit, 1).
func (l *Limiter) Allow(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.door.AllowN(ctx, key, limit, 1)
}

// AllowN decides whether key may spend n (at least 1) under limit now, and
// spends it if so. Over the limit is a Result with Allowed false; the error
// is for invalid input (ErrInvalidKey, ErrInvalidLimit, ErrInvalidCost,
// ErrCostExceedsBurst — nothing is sent to the store) and for a store that
// failed. For a shaping LeakyBucket an admitted request may carry a Delay
// that the caller should wait before acting.
func (l *Limiter) AllowN(ctx context.Context, key string, limit Limit, n int) (Result, error) {
	if n < 1 {
		return Result{Limit: limit}, fmt.Errorf("%w: cost must be at least 1, got %d", ErrInvalidCost, n)
	}
	return l.door.AllowN(ctx, key, limit, n)
}

// within is a Limiter's store under its WithTimeout deadline.
type within struct{ l *Limiter }

func (w within) AllowN(ctx context.Context, key string, limit Limit, n int) (Result, error) {
	return w.l.decideWithin(ctx, key, limit, n)
}

// Peek reports key's state under limit without spending anything: Remaining
// and ResetAfter as they stand now.
func (l *Limiter) Peek(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.decide(ctx, key, limit, 0)
}

func (l *Limiter) decide(ctx context.Context, key string, limit Limit, n int) (Result, error) {
	return l.door.AllowN(ctx, key, limit, n)
}

// decideWithin is decide under WithTimeout's deadline.
func (l *Limiter) decideWithin(ctx context.Context, key string, limit Limit, n int) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return l.store.AllowN(ctx, key, limit, n)
}

// Wait is WaitN(ctx, key, limit, 1).
func (l *Limiter) Wait(ctx context.Context, key string, limit Limit) error {
	return l.WaitN(ctx, key, limit, 1)
}

// WaitN blocks until key may spend n under limit, spends it, and returns
// nil; or returns an error when the context ends first. When the context's
// deadline comes before the request could go, it returns
// ErrWaitExceedsDeadline at once instead of sleeping in vain.
//
// This is how a service stays under an outside provider's quota from many
// replicas: every replica waits on the same key of a shared store, so
// together they send no more than the limit. With a token bucket, replicas
// that wake together race for the next token and the losers wait again
// (one store call each); with a shaping LeakyBucket (MaxDelay > 0) every
// call reserves its own slot in one store call and waits for it, which is
// fairer and cheaper under contention.
//
// A shaping call never reserves a slot it will not use: when the context
// has a deadline, the call asks the store for a slot no later than the
// deadline (MaxDelay becomes the smaller of limit.MaxDelay and the time
// left, in whole microseconds), so a caller that cannot be served in time
// is denied and leaves the queue to those who can. A cost that only the
// full MaxDelay could admit then fails with ErrWaitExceedsDeadline, not
// ErrCostExceedsBurst. The one slot that can still be lost is one whose
// store call itself lasted past the margin between the slot and the
// deadline.
func (l *Limiter) WaitN(ctx context.Context, key string, limit Limit, n int) error {
	if n < 1 {
		return fmt.Errorf("%w: cost must be at least 1, got %d", ErrInvalidCost, n)
	}
	deadline, hasDeadline := ctx.Deadline()
	for {
		call := limit
		if hasDeadline && limit.MaxDelay > 0 {
			call.MaxDelay = min(limit.MaxDelay, max(time.Until(deadline).Truncate(time.Microsecond), 0))
		}
		res, err := l.decide(ctx, key, call, n)
		if err != nil {
			if call.MaxDelay < limit.MaxDelay && errors.Is(err, ErrCostExceedsBurst) && n <= limit.Capacity() {
				return fmt.Errorf("%w: a cost of %d needs a longer delay than the %v left", ErrWaitExceedsDeadline, n, call.MaxDelay)
			}
			return err
		}
		// wait is how long to sleep; goes, how long until the request
		// could go: for a shaper's denial, the retry and then a delay of
		// up to MaxDelay.
		wait := res.RetryAfter
		goes := wait + call.MaxDelay
		if res.Allowed {
			wait, goes = res.Delay, res.Delay
		}
		if wait <= 0 {
			return nil
		}
		if hasDeadline && time.Until(deadline) < goes {
			if res.Allowed {
				// The store admitted a slot before the deadline, but its
				// answer came too late to keep it.
				return fmt.Errorf("%w: admitted with a delay of %v, and the store's answer came too late for it", ErrWaitExceedsDeadline, wait)
			}
			return fmt.Errorf("%w: retry in %v", ErrWaitExceedsDeadline, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if res.Allowed {
			return nil
		}
	}
}

// Reset forgets what key has spent under limit.
func (l *Limiter) Reset(ctx context.Context, key string, limit Limit) error {
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	return l.store.Reset(ctx, key, limit)
}
