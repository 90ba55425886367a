// Package tiered puts a local tier in front of a global tollgate.Store
// (redisstore, shared by every instance of a service) to spare the global
// store the calls whose answer is already known, and to keep deciding when
// it fails.
//
// The model: the global store stays the authority — every request it would
// admit still goes to it — and the local tier answers only what it can
// derive from what the global store said:
//
//   - Denial cache (WithDenialCache, off by default). After the global
//     store denies a key, or admits a request that leaves less than its
//     cost, the next requests of that key which the global store would
//     certainly deny are denied locally, with the Result the global store
//     would give (Remaining, RetryAfter and ResetAfter computed from the
//     remembered Result and the time elapsed; see the notes below), until
//     they could pass. An abusive client then costs the global store about
//     one call per token it earns, however fast it sends. It is off by
//     default because it rests on a premise about every program that
//     shares the global store, which no instance can check by itself: that
//     no one refunds (see "What a local denial promises").
//   - Token leases (WithLeases, off by default). A request takes K tokens
//     from the global store in one call and spends them locally, one call
//     per K decisions, for TokenBucket, GCRA, a policing LeakyBucket and
//     FixedWindow. The lease is consulted first (its tokens are already
//     paid for), then the denial cache. One request at a time takes a
//     key's lease in an instance; the others that find it empty meanwhile
//     ask the global store for their own cost only. The price is
//     precision: an instance holds, per key, at most K tokens that the
//     global store counted as spent when they were taken. So between any
//     two moments, the instances together admit at most what the limit
//     alone admits between them plus K per instance: Burst + Rate ×
//     elapsed + instances × K for the buckets (at one instant, Burst +
//     instances × K), while the global store answers (degraded mode has
//     its own limit). A FixedWindow lease ends with its window, so no
//     window admits more than Rate: there, leases only save calls. A
//     lease's unspent tokens are lost when it expires, which only admits
//     less. Use leases for high-rate limits where K × instances is small
//     next to the limit (K = 10 on a limit of 10,000 per second), never
//     for login or payment limits.
//   - Degraded mode. When the global store fails or times out (WithTimeout
//     bounds each call), the request is decided by a local memorystore at
//     the limit divided by the number of instances (WithInstances), instead
//     of admitting everything (fail-open) or nothing (fail-closed). After
//     several consecutive failures a circuit breaker stops calling the
//     global store for a cool-down, then lets one request probe it and
//     closes again when that succeeds (WithBreaker). Transitions are logged
//     (log/slog) and counted (Stats, WithStateChange); every decision made
//     locally is counted.
//
// What a local denial promises: it is the denial the global store would give
// at that moment, provided that since the global answer it was derived from
// nothing gave back what the key had spent, but time: no refund (a settle
// for less than was reserved, by any instance or program), no Reset but
// through this store, and no decision of the key under another Rate or
// Burst of the same algorithm and period (instances that disagree on a
// limit, during its rollout). Whatever else the other instances do, they
// can only have spent more, and the elapsed time is counted from when the
// global call was sent (before the global store decided), so the local tier
// assumes at least the refill there was. The premise cannot be checked
// locally: a refund made by another instance is seen only by asking the
// global store, the very call the cache saves (a count of refunds kept
// there would have to be read on every local answer too), and it can undo
// a denial for as long as the remembered RetryAfter, which for a key in
// debt is long; a shorter life for remembered entries would make wrong
// denials shorter, not impossible. So the cache is off unless WithDenialCache says the premise holds,
// and a Store made with it keeps the premise for its part: it refuses
// refunds (SettleN for less than reserved fails and changes nothing), so
// that instances configured alike keep it together. Turn it on where keys
// are only spent (AllowN, reservations settled at their cost or above,
// costs charged after the fact); leave it off where requests are refunded.
//
// Exactness: the local Result equals what the global store would answer if
// nothing else had touched the key: for GCRA and FixedWindow the remembered
// Result gives the whole state; for TokenBucket and LeakyBucket it gives
// the level to within one microsecond of drain (a single value when the
// rate divides the period in microseconds: every "N per second" with N
// dividing 10^6, and so on), and a request is answered locally only when
// every level in that range gives the same denial. For the sliding windows the Result does not say when room frees up for larger
// costs, so only cost-1 denials are answered locally (Remaining 0, exact
// durations); the rest go to the global store. After the global store's
// clock went backwards (its state is then ahead of its clock, and every
// duration it reports carries the difference), a local answer is still the
// global store's, field by field; but a bucket whose durations come to more
// than 2^53 units of its limit (a GCRA state months ahead of its clock, at
// millions per day) is left to the global store.
//
// The store is a tollgate.Settler when its global store is one: reservations
// and settles go to the global store (see ReserveN and SettleN).
//
// Reset through this store clears the local tier for the key; a Reset made
// elsewhere (another instance, redis-cli) is not seen until the key's local
// entries run out, at the latest after the RetryAfter that was remembered.
package tiered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

// Store is a tollgate.Store with a local tier in front of a global one.
// Create it with New; it is safe for concurrent use and holds no goroutine
// of its own.
type Store struct {
	global   tollgate.Store
	now      func() time.Time
	timeout  time.Duration
	log      *slog.Logger
	onChange func(from, to State)

	denials *table[seen] // nil without WithDenialCache

	leaseSize int
	leaseTTL  time.Duration
	leases    *table[lease]
	tickets   atomic.Uint64 // numbers lease takes (see claimTake)

	degraded  bool
	instances int
	localFor  func(tollgate.Limit) tollgate.Limit
	local     *memorystore.Store

	cache   bool
	maxKeys int
	breaker breaker
	stats   counters
}

var _ tollgate.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*options)

// options are what the Options set: the Store being made.
type options struct{ s Store }

// WithClock makes the store read the time from now (for tests; give the
// global store the same clock). Without it the store reads the monotonic
// clock, anchored to the system clock when New ran, so that a step of the
// system clock changes no decision, local or degraded.
func WithClock(now func() time.Time) Option { return func(o *options) { o.s.now = now } }

// WithTimeout bounds every call to the global store by d, on top of the
// caller's context (default 100ms; 0 leaves only the caller's context). A
// call that runs out counts as a failure of the global store, and the
// request is decided locally.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.s.timeout = d } }

// WithInstances says how many instances share the global store: in degraded
// mode each decides locally at the limit divided by n (Rate and Burst, each
// at least 1), so that together they stay near the limit. Default 1.
func WithInstances(n int) Option { return func(o *options) { o.s.instances = max(1, n) } }

// WithDegradedLimit replaces the division by WithInstances: f returns the
// limit to apply locally, in degraded mode, instead of l.
func WithDegradedLimit(f func(l tollgate.Limit) tollgate.Limit) Option {
	return func(o *options) { o.s.localFor = f }
}

// WithoutDegradedMode returns the global store's error instead of deciding
// locally, so that the caller's own failure policy (fail-open or
// fail-closed) applies; the breaker then fails decisions fast while open.
func WithoutDegradedMode() Option { return func(o *options) { o.s.degraded = false } }

// WithBreaker sets how many consecutive failures of the global store open
// the breaker (default 5) and how long it stays open before probing
// (default 1s).
func WithBreaker(failures int, coolDown time.Duration) Option {
	return func(o *options) {
		o.s.breaker.threshold = max(1, failures)
		o.s.breaker.coolDown = max(0, coolDown)
	}
}

// WithDenialCache turns the denial cache on (see the package doc): the
// requests of a key that the global store would certainly deny are denied
// locally. It says that nothing refunds what keys spend in the global
// store — no instance or other program sharing it settles a reservation
// for less than it reserved — and the store keeps that for its part:
// SettleN with an actual cost below the reserved one fails, and changes
// nothing. Reservations settled at their cost or above, and costs charged
// after the fact, are fine.
func WithDenialCache() Option { return func(o *options) { o.s.cache = true } }

// WithLeases enables token leases of k tokens (see the package doc), each
// valid for ttl (default 1s; a FixedWindow lease also ends with its window).
// k < 2 leaves leases off. Each instance may then admit, per key, up to k
// more (in cost) than the limit alone admits; k above a limit's Capacity
// counts as its Capacity.
func WithLeases(k int, ttl time.Duration) Option {
	return func(o *options) {
		o.s.leaseSize = k
		if ttl <= 0 {
			ttl = time.Second
		}
		o.s.leaseTTL = ttl
	}
}

// WithMaxKeys bounds how many keys each local table (remembered denials,
// leases, degraded-mode state) holds (default 100,000).
func WithMaxKeys(n int) Option { return func(o *options) { o.s.maxKeys = n } }

// WithLogger sets where breaker transitions are logged (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.s.log = l } }

// WithStateChange calls f on every breaker transition, after it is logged
// and counted: a hook for metrics and alerts. f must not block.
func WithStateChange(f func(from, to State)) Option { return func(o *options) { o.s.onChange = f } }

// New returns a Store deciding against global, with a local tier.
func New(global tollgate.Store, opts ...Option) *Store {
	o := options{s: Store{
		global:    global,
		now:       monotonicClock(),
		timeout:   100 * time.Millisecond,
		log:       slog.Default(),
		degraded:  true,
		instances: 1,
		maxKeys:   100_000,
	}}
	o.s.breaker.threshold, o.s.breaker.coolDown = 5, time.Second
	for _, opt := range opts {
		opt(&o)
	}
	s := &o.s
	if s.cache {
		s.denials = newTable(s.maxKeys, func(e *seen, now time.Time) bool { return !now.Before(e.until) })
	}
	if s.leaseSize >= 2 {
		s.leases = newTable(s.maxKeys, func(l *lease, now time.Time) bool { return !now.Before(l.expires) })
	}
	s.local = memorystore.New(memorystore.WithClock(s.now), memorystore.WithMaxKeys(s.maxKeys), memorystore.WithShards(64))
	s.breaker.onChange = s.transition
	return s
}

// AllowN implements tollgate.Store: from the local tier when it knows the
// answer, else from the global store, else (the global store failing)
// from the degraded-mode limit.
func (s *Store) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	p, err := tollgate.CheckRequest(key, limit, n)
	if err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: %w", err)
	}
	k := keyOf(key, limit)
	now := s.now()
	if n > 0 {
		// The lease first: its tokens are already paid for in the global
		// store, so a denial remembered from there does not apply to them.
		if s.leases != nil && leasable(limit) {
			if res, ok := s.spendLease(k, limit, n, now); ok {
				return res, nil
			}
		}
		if res, ok := s.cachedDenial(k, &p, limit, n, now); ok {
			return res, nil
		}
	}
	ok, probe := s.breaker.allow(now)
	if !ok {
		return s.decideLocally(key, limit, n, now, errBreakerOpen)
	}
	cost := n
	if s.leases != nil && leasable(limit) && n > 0 {
		// One take at a time per key: while it is in flight, the others
		// ask for their own cost.
		if ticket := s.claimTake(k, limit, now); ticket != 0 {
			defer s.releaseTake(k, ticket, now)
			cost = s.leaseCost(limit, n)
		}
	}
	res, err := s.callGlobal(ctx, key, limit, cost, now, probe)
	if err != nil {
		if errors.Is(err, errCallerGone) {
			return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: %w", ctx.Err())
		}
		if isInputError(err) {
			return res, err
		}
		return s.decideLocally(key, limit, n, now, err)
	}
	if cost > n {
		return s.leaseTaken(ctx, k, &p, key, limit, n, cost, res, now)
	}
	s.remember(k, &p, limit, n, res, now)
	return res, nil
}

// systemClock reads the system's clock (a variable so that tests can step
// it, as NTP or an operator might).
var systemClock = time.Now

// monotonicClock returns the store's default clock, as memorystore's: the
// monotonic clock, anchored to the system clock once. The local tables
// compare times (which Go does on the monotonic reading anyway), but the
// degraded-mode memorystore counts in µs since the Unix epoch, where a step
// of the wall clock would refill every bucket at once or hold it empty.
func monotonicClock() func() time.Time {
	start := systemClock()
	return func() time.Time { return start.Add(time.Since(start)) }
}

var (
	errBreakerOpen = errors.New("tiered: global store failing, breaker open")
	errCallerGone  = errors.New("tiered: caller's context ended")
)

// callGlobal asks the global store, bounded by the store's timeout, and
// tells the breaker how it went.
func (s *Store) callGlobal(ctx context.Context, key string, limit tollgate.Limit, n int, sent time.Time, probe bool) (tollgate.Result, error) {
	return s.callGlobalWith(ctx, limit, probe, func(ctx context.Context) (tollgate.Result, error) {
		return s.global.AllowN(ctx, key, limit, n)
	})
}

// callGlobalWith makes call to the global store, bounded by the store's
// timeout, and tells the breaker how it went.
func (s *Store) callGlobalWith(ctx context.Context, limit tollgate.Limit, probe bool, call func(context.Context) (tollgate.Result, error)) (tollgate.Result, error) {
	gctx := ctx
	if s.timeout > 0 {
		var cancel context.CancelFunc
		gctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	s.stats.globalCalls.Add(1)
	res, err := call(gctx)
	switch {
	case err == nil:
		s.breaker.success(probe)
		return res, nil
	case isInputError(err):
		s.breaker.abandon(probe)
		return res, err
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up: that says nothing about the global store.
		s.breaker.abandon(probe)
		return res, errCallerGone
	}
	s.stats.globalErrors.Add(1)
	s.log.Debug("tiered: global store failed", "limit", limit.String(), "err", err) // not the key: it may be a client address or an API key
	s.breaker.failure(probe, s.now(), err)
	return res, err
}

func isInputError(err error) bool {
	for _, e := range []error{tollgate.ErrInvalidKey, tollgate.ErrInvalidLimit, tollgate.ErrInvalidCost, tollgate.ErrCostExceedsBurst} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// cachedDenial answers a request the global store would certainly deny,
// and counts it.
func (s *Store) cachedDenial(k skey, p *tollgate.Params, limit tollgate.Limit, n int, now time.Time) (tollgate.Result, bool) {
	res, ok := s.lookupDenial(k, p, limit, n, now)
	if ok {
		s.stats.localDenials.Add(1)
	}
	return res, ok
}

func (s *Store) lookupDenial(k skey, p *tollgate.Params, limit tollgate.Limit, n int, now time.Time) (tollgate.Result, bool) {
	var res tollgate.Result
	var ok bool
	s.denials.update(k, now, func(e seen, found bool) (seen, bool) {
		if !found {
			return e, false
		}
		if e.limit != limit || !now.Before(e.until) {
			return e, false // stale or for another limit: forget it
		}
		res, ok = e.deny(p, n, now)
		return e, true
	})
	return res, ok
}

// remember keeps what the global store said when it can deny later
// requests, and forgets what it knew before otherwise.
func (s *Store) remember(k skey, p *tollgate.Params, limit tollgate.Limit, n int, res tollgate.Result, sent time.Time) {
	e, keep := remember(p, limit, n, res, sent)
	s.denials.update(k, sent, func(old seen, found bool) (seen, bool) {
		if !keep && !res.Allowed {
			// A denial changes nothing in the global store: what was
			// remembered before still holds.
			return old, found
		}
		return e, keep
	})
}

// decideLocally makes a degraded-mode decision, or returns the failure when
// degraded mode is off.
func (s *Store) decideLocally(key string, limit tollgate.Limit, n int, now time.Time, cause error) (tollgate.Result, error) {
	if !s.degraded {
		return tollgate.Result{Limit: limit}, fmt.Errorf("tiered: %w", cause)
	}
	l := s.localLimit(limit)
	if n > l.Capacity() {
		// The local share can never admit this cost: deny it until the
		// global store may be back.
		s.stats.degraded.Add(1)
		retry := max(s.breaker.retryIn(now), time.Microsecond)
		return tollgate.Result{Limit: l, RetryAfter: retry}, nil
	}
	res, err := s.local.AllowN(context.Background(), key, l, n)
	if err != nil {
		return res, fmt.Errorf("tiered: degraded limit %v for %v: %w (global store: %w)", l, limit, err, cause)
	}
	s.stats.degraded.Add(1)
	return res, nil
}

// localLimit is limit as enforced by each instance in degraded mode.
func (s *Store) localLimit(limit tollgate.Limit) tollgate.Limit {
	if s.localFor != nil {
		return s.localFor(limit)
	}
	if s.instances <= 1 {
		return limit
	}
	limit.Rate = max(1, limit.Rate/s.instances)
	if limit.Burst > 0 {
		limit.Burst = max(1, limit.Burst/s.instances)
	}
	return limit
}

// Reset implements tollgate.Store: it forgets the key locally (remembered
// denials, leases, degraded-mode state) and in the global store.
func (s *Store) Reset(ctx context.Context, key string, limit tollgate.Limit) error {
	if _, err := tollgate.CheckRequest(key, limit, 0); err != nil {
		return fmt.Errorf("tiered: %w", err)
	}
	k := keyOf(key, limit)
	s.denials.delete(k)
	if s.leases != nil {
		s.leases.delete(k)
	}
	_ = s.local.Reset(ctx, key, s.localLimit(limit))
	if err := s.global.Reset(ctx, key, limit); err != nil {
		return fmt.Errorf("tiered: %w", err)
	}
	return nil
}

// transition logs, counts and reports a breaker transition.
func (s *Store) transition(from, to State, cause error) {
	switch to {
	case Open:
		s.stats.opened.Add(1)
		if from == HalfOpen {
			s.log.Warn("tiered: probe of the global store failed, breaker open again", "cool_down", s.breaker.coolDown, "err", cause)
		} else {
			s.log.Warn("tiered: global store failing, breaker open: deciding locally", "failures", s.breaker.threshold, "cool_down", s.breaker.coolDown, "err", cause)
		}
	case HalfOpen:
		s.stats.probes.Add(1)
		s.log.Info("tiered: breaker half-open, probing the global store")
	case Closed:
		s.stats.closed.Add(1)
		s.log.Info("tiered: global store answers again, breaker closed")
	}
	if s.onChange != nil {
		s.onChange(from, to)
	}
}

type counters struct {
	globalCalls, globalErrors            atomic.Uint64
	localDenials, leaseHits, leasesTaken atomic.Uint64
	degraded                             atomic.Uint64
	opened, probes, closed               atomic.Uint64
}

// Stats counts what a Store did since it was created.
type Stats struct {
	// GlobalCalls counts calls to the global store (a lease taken is one).
	GlobalCalls uint64
	// GlobalErrors counts those that failed or timed out.
	GlobalErrors uint64
	// LocalDenials counts denials answered by the local tier.
	LocalDenials uint64
	// LeasesTaken counts leases taken; LeaseHits, decisions admitted from a
	// lease without a global call.
	LeasesTaken, LeaseHits uint64
	// Degraded counts decisions made by the degraded-mode local limit.
	Degraded uint64
	// BreakerOpened, BreakerProbes and BreakerClosed count transitions to
	// open, half-open and (back to) closed.
	BreakerOpened, BreakerProbes, BreakerClosed uint64
	// State is the breaker's state now.
	State State
	// Remembered is how many keys the denial cache holds now.
	Remembered int
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		GlobalCalls:   s.stats.globalCalls.Load(),
		GlobalErrors:  s.stats.globalErrors.Load(),
		LocalDenials:  s.stats.localDenials.Load(),
		LeasesTaken:   s.stats.leasesTaken.Load(),
		LeaseHits:     s.stats.leaseHits.Load(),
		Degraded:      s.stats.degraded.Load(),
		BreakerOpened: s.stats.opened.Load(),
		BreakerProbes: s.stats.probes.Load(),
		BreakerClosed: s.stats.closed.Load(),
		State:         State(s.breaker.state.Load()),
		Remembered:    s.denials.len(),
	}
}
