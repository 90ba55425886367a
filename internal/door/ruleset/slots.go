package ruleset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/settings"
	"github.com/tollgate/tollgate/internal/door/storekey"
	"github.com/tollgate/tollgate/internal/store/permit"
)

// DefaultLease is a concurrency rule's lease when it sets none: long
// enough that a request renews it rarely, short enough that a crashed
// holder's slot comes back soon.
const DefaultLease = 30 * time.Second

// Slots is a concurrency rule as every transport applies it: at most max
// requests per key hold a slot at once, across every replica sharing the
// store. Take takes a slot for a request, or says why not; the Holding it
// returns renews the slot's lease while the request runs and gives the
// slot back at End. The transports (httplimit, grpclimit) say which
// requests a rule applies to, where the key comes from, and how a refusal
// is written; the rest is here, once.
type Slots struct {
	store     tollgate.ConcurrencyStore
	name      string
	max       int
	lease     time.Duration
	closed    bool
	deadlines *engine.Deadlines // nil: only the caller's own deadline
	set       settings.Door
	// One sampler per kind of store call, so that an outage of acquires
	// does not hide the first failed renewal or release.
	acquireLog, renewLog, releaseLog engine.Sampler
}

// NewSlots checks a concurrency rule and prepares it; pkg starts the
// messages of its errors. A zero lease is DefaultLease; FailDefault fails
// open. Of the door's settings set, the timeout, logger, log interval,
// clock and fail-closed Retry-After apply.
func NewSlots(pkg string, store tollgate.ConcurrencyStore, name string, max int, lease time.Duration, mode enforce.FailureMode, set settings.Door) (*Slots, error) {
	if lease == 0 {
		lease = DefaultLease
	}
	if store == nil {
		return nil, errors.New(pkg + ": concurrency: nil store")
	}
	if err := checkName("concurrency rule", name); err != nil {
		return nil, fmt.Errorf("%s: %w", pkg, err)
	}
	if mode > enforce.FailClosed {
		return nil, fmt.Errorf("%s: concurrency rule %q: unknown failure mode %v", pkg, name, mode)
	}
	// The store checks max and lease the same way on every call; checked
	// here, a bad rule fails at start rather than on every request.
	if _, err := permit.CheckAcquire(name, max, lease); err != nil {
		return nil, fmt.Errorf("%s: concurrency rule %q: %w", pkg, name, err)
	}
	s := &Slots{store: store, name: name, max: max, lease: lease, closed: mode == enforce.FailClosed, set: set}
	if s.set.Timeout > 0 {
		s.deadlines = engine.NewDeadlines(s.set.Timeout)
	}
	s.acquireLog.Every, s.renewLog.Every, s.releaseLog.Every = s.set.LogEvery, s.set.LogEvery, s.set.LogEvery
	return s, nil
}

// Name is the rule's name.
func (s *Slots) Name() string { return s.name }

// FailClosedRetryAfter is when a client turned away by a fail-closed rule
// whose store failed should come back (WithFailClosedRetryAfter).
func (s *Slots) FailClosedRetryAfter() time.Duration { return s.set.FailRetryAfter }

// Take takes a slot for the request whose key value is value and whose
// context is ctx. The outcome is Allowed (h holds the slot: call h.End when
// the request ends), Denied (res says when a slot frees up), FailedOpen
// (the store failed: run the request without a slot) or FailedClosed (the
// store failed: refuse it); err is the store's error for the last two.
// The store call is bounded by the deadline (WithTimeout, or the caller's
// own less a reserve); a slot taken by a call whose answer came too late
// is not known here, and lapses at the end of its lease.
func (s *Slots) Take(ctx context.Context, value string) (h *Holding, res tollgate.ConcurrencyResult, o engine.Outcome, err error) {
	b := make([]byte, 0, len(s.name)+1+len(value))
	b = append(append(append(b, s.name...), ':'), value...)
	key := storekey.String(b, len(s.name)+1)
	actx, cancel, _ := s.deadlines.AnswerIn(ctx, nil)
	p, res, err := s.store.Acquire(actx, key, s.max, s.lease)
	cancel()
	switch {
	case err != nil && s.closed:
		s.logFailure(ctx, &s.acquireLog, "acquire", "fail_closed", err)
		return nil, res, engine.FailedClosed, err
	case err != nil:
		s.logFailure(ctx, &s.acquireLog, "acquire", "fail_open", err)
		return nil, res, engine.FailedOpen, err
	case !res.Allowed:
		return nil, res, engine.Denied, nil
	}
	return s.hold(ctx, p), res, engine.Allowed, nil
}

// Holding is a request's slot while it runs: it renews the lease in the
// background and gives the slot back at End.
type Holding struct {
	s *Slots
	// ctx is the renewals' context: the request's values, not its
	// cancellation (a renewal runs while the request does, whatever the
	// client does). End cancels it, which is what ends a renewal in flight
	// when no deadline was set; otherwise the deadline does.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	p       tollgate.Permit
	timer   *time.Timer
	ended   bool
	running sync.WaitGroup // a renewal in flight
}

func (s *Slots) hold(reqCtx context.Context, p tollgate.Permit) *Holding {
	h := &Holding{s: s, p: p}
	h.ctx, h.cancel = context.WithCancel(context.WithoutCancel(reqCtx))
	h.mu.Lock()
	h.timer = time.AfterFunc(s.lease/2, h.renew)
	h.mu.Unlock()
	return h
}

// renew runs on the timer: it extends the lease and sets the timer for
// the next renewal, half a lease later, or a quarter lease after a failed
// renewal, which leaves one more try before the lease ends. Half a lease
// leaves a late or slow renewal the other half to land in, and costs one
// store call per half lease only for requests that run that long: a
// request shorter than half its lease makes none. A permit found lapsed is
// not renewed again: its slot may be someone else's now.
func (h *Holding) renew() {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.running.Add(1)
	p := h.p
	h.mu.Unlock()
	defer h.running.Done()

	s := h.s
	ctx, cancel, _ := s.deadlines.AnswerIn(h.ctx, nil)
	np, err := s.store.Renew(ctx, p, s.lease)
	cancel()
	next := s.lease / 2
	if err != nil {
		if h.ctx.Err() != nil {
			return // the request ended during the call: nothing to report
		}
		if errors.Is(err, tollgate.ErrPermitExpired) {
			s.logFailure(h.ctx, &s.renewLog, "renew", "lapsed_stop_renewing", err)
			return
		}
		s.logFailure(h.ctx, &s.renewLog, "renew", "retry", err)
		next = s.lease / 4
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.p = np
	}
	if !h.ended {
		h.timer.Reset(next)
	}
}

// End stops the renewals, waits for one in flight, and gives the slot
// back with a context the request's end does not cancel.
func (h *Holding) End() {
	h.mu.Lock()
	h.ended = true
	h.timer.Stop()
	h.mu.Unlock()
	h.cancel()
	h.running.Wait()

	s := h.s
	ctx, cancel, _ := s.deadlines.AnswerIn(context.WithoutCancel(h.ctx), nil)
	defer cancel()
	if err := s.store.Release(ctx, h.p); err != nil {
		s.logFailure(ctx, &s.releaseLog, "release", "lapses_at_lease_end", err)
	}
}

// logFailure logs a failed store call, at most once per log interval for
// each kind of call, saying how many were left out.
func (s *Slots) logFailure(ctx context.Context, smp *engine.Sampler, op, outcome string, err error) {
	ok, skipped := smp.Allow(s.set.Now())
	if !ok {
		return
	}
	s.set.Logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "tollgate: concurrency store call failed",
		slog.String("rule", s.name), slog.String("call", op), slog.String("outcome", outcome),
		slog.String("error", err.Error()), engine.Skipped(skipped))
}
