package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/guard"
	"github.com/tollgate/tollgate/internal/storekey"
)

// DefaultLease is the lease of a ConcurrencyRule that sets none: how long
// a slot stays taken after the process holding it dies. Requests that run
// longer keep theirs by renewing it.
const DefaultLease = 30 * time.Second

// ConcurrencyRule limits how many of the requests it matches run at once
// for each key: "at most 5 exports in flight per tenant". Where a Rule
// bounds how often requests start, a ConcurrencyRule bounds how many run,
// which is what protects an endpoint whose cost is its duration (an
// export, a report, a long model completion). With a redisstore.Store the
// limit is shared by every replica.
type ConcurrencyRule struct {
	// Name identifies the limit in store keys, logs and the violated
	// policy of a 429: 1 to 64 printable ASCII characters without ':'.
	// Required.
	Name string
	// Pattern, in net/http.ServeMux syntax ("POST /exports"), limits the
	// rule to the requests it matches; "" matches all.
	Pattern string
	// Match, if set, must also return true for the rule to apply.
	Match func(*http.Request) bool
	// Key says whose slots a request takes: the tenant, the user, the API
	// key. When it returns false the request is not limited. Required;
	// for one limit over every request, return the same value for all.
	Key func(*http.Request) (string, bool)
	// Max is how many requests with one key may run at once, across every
	// process sharing the store: 1 to tollgate.MaxConcurrency.
	Max int
	// Lease is how long a slot is taken for before it lapses unless
	// renewed (zero: DefaultLease); tollgate.MinLease to tollgate.MaxLease.
	// A request still running at half its lease renews it, in the
	// background, every half lease until it ends. The lease is also how
	// long a slot of a crashed process stays taken.
	Lease time.Duration
	// FailureMode says what happens when the store fails or misses its
	// deadline: FailOpen runs the request without a slot, FailClosed
	// answers 503 with Retry-After; left zero, the rule fails open.
	FailureMode FailureMode
}

// concSettings are the Options a concurrency limit reads.
type concSettings struct {
	timeout        time.Duration
	logger         *slog.Logger
	logEvery       time.Duration
	failRetryAfter time.Duration
	now            func() time.Time
}

// concurrency is one ConcurrencyRule, ready to serve.
type concurrency struct {
	store     tollgate.ConcurrencyStore
	name      string
	pat       *pattern
	match     func(*http.Request) bool
	key       func(*http.Request) (string, bool)
	max       int
	lease     time.Duration
	closed    bool
	deadlines *guard.Deadlines // nil: only the request's own deadline
	reject    func(http.ResponseWriter, *http.Request, Rejection)
	set       concSettings
	// One sampler per kind of store call, so that an outage of acquires
	// does not hide the first failed renewal or release.
	acquireLog, renewLog, releaseLog guard.Sampler
}

// Concurrency returns middleware that holds each request the rule matches
// to the rule's concurrency limit: before the handler runs it takes one of
// Max slots on the request's key from store, and it gives the slot back
// when the handler returns, or panics. While the handler runs past half the
// lease, the slot's lease is renewed in the background every half lease; a
// renewal that fails is logged and retried sooner, and the request goes on.
//
// A request that finds every slot taken gets 429 Too Many Requests, with
// Retry-After set to the store's RetryAfter in whole seconds rounded up (at
// least 1) — when a slot frees up at the latest, as holders usually finish
// sooner — and a problem+json body naming the rule (or what
// WithRejectHandler writes; Rejection.Concurrency holds the decision).
//
// Each store call is bounded as WithTimeout says (50 ms by default). When
// the store fails or misses that deadline on taking a slot, the rule's
// FailureMode applies: fail open runs the handler without a slot, fail
// closed answers 503 with WithFailClosedRetryAfter's Retry-After. A slot
// taken by a call whose answer came too late is not known here; it lapses
// at the end of its lease. Failures are logged (WithLogger), at most once
// per WithLogInterval for each kind of call. The other Options do not
// apply; no metrics are recorded.
//
// Put the rate limits first, lim.Handler(conc(mux)), so that a client
// over its rate is answered without a store call for a slot.
func Concurrency(store tollgate.ConcurrencyStore, rule ConcurrencyRule, opts ...Option) (func(http.Handler) http.Handler, error) {
	c, err := newConcurrency(store, rule, opts)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(w, r, next) })
	}, nil
}

func newConcurrency(store tollgate.ConcurrencyStore, rule ConcurrencyRule, opts []Option) (*concurrency, error) {
	o := options{reject: WriteProblem, conc: concSettings{
		timeout: enforce.DefaultTimeout, logEvery: enforce.DefaultLogInterval,
		failRetryAfter: time.Second, now: time.Now,
	}}
	for _, f := range opts {
		f(&o)
	}
	if o.conc.logger == nil {
		o.conc.logger = slog.Default()
	}
	lease := rule.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	switch {
	case store == nil:
		return nil, errors.New("httplimit: concurrency: nil store")
	case rule.Name == "" || len(rule.Name) > 64 || strings.ContainsFunc(rule.Name, func(c rune) bool { return c < '!' || c > '~' || c == ':' }):
		return nil, fmt.Errorf("httplimit: concurrency rule name %q: want 1 to 64 printable ASCII characters without ':'", rule.Name)
	case rule.Key == nil:
		return nil, fmt.Errorf("httplimit: concurrency rule %q: no Key", rule.Name)
	case rule.FailureMode != enforce.FailDefault && rule.FailureMode != FailOpen && rule.FailureMode != FailClosed:
		return nil, fmt.Errorf("httplimit: concurrency rule %q: unknown failure mode %v", rule.Name, rule.FailureMode)
	}
	// The store checks max and lease the same way on every call; checked
	// here, a bad rule fails at start rather than on every request.
	if _, err := tollgate.CheckAcquire(rule.Name, rule.Max, lease); err != nil {
		return nil, fmt.Errorf("httplimit: concurrency rule %q: %w", rule.Name, err)
	}
	c := &concurrency{
		store: store, name: rule.Name, match: rule.Match, key: rule.Key, max: rule.Max, lease: lease,
		closed: rule.FailureMode == FailClosed, reject: o.reject, set: o.conc,
	}
	if rule.Pattern != "" {
		var err error
		if c.pat, err = parsePattern(rule.Pattern); err != nil {
			return nil, fmt.Errorf("httplimit: concurrency rule %q: %w", rule.Name, err)
		}
	}
	if o.conc.timeout > 0 {
		c.deadlines = guard.NewDeadlines(o.conc.timeout)
	}
	c.acquireLog.Every, c.renewLog.Every, c.releaseLog.Every = o.conc.logEvery, o.conc.logEvery, o.conc.logEvery
	return c, nil
}

// storeKey returns the store key of a request whose key is value:
// "<rule>:<value>", hashed as the rules' keys are when too long.
func (c *concurrency) storeKey(value string) string {
	b := make([]byte, 0, len(c.name)+1+len(value))
	b = append(append(append(b, c.name...), ':'), value...)
	return storekey.String(b, len(c.name)+1)
}

func (c *concurrency) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if (c.pat != nil && !c.pat.match(r)) || (c.match != nil && !c.match(r)) {
		next.ServeHTTP(w, r)
		return
	}
	value, ok := c.key(r)
	if !ok {
		next.ServeHTTP(w, r)
		return
	}
	ctx, cancel, _ := c.deadlines.AnswerIn(r.Context(), nil)
	p, res, err := c.store.Acquire(ctx, c.storeKey(value), c.max, c.lease)
	cancel()
	switch {
	case err != nil && c.closed:
		c.logFailure(r.Context(), &c.acquireLog, "acquire", "fail_closed", err)
		headers.SetRetryAfter(w.Header(), c.set.failRetryAfter)
		c.reject(w, r, Rejection{Status: http.StatusServiceUnavailable, Rule: c.name, RetryAfter: c.set.failRetryAfter, Err: err})
		return
	case err != nil:
		c.logFailure(r.Context(), &c.acquireLog, "acquire", "fail_open", err)
		next.ServeHTTP(w, r)
		return
	case !res.Allowed:
		headers.SetRetryAfter(w.Header(), res.RetryAfter)
		c.reject(w, r, Rejection{Status: http.StatusTooManyRequests, Rule: c.name, Policy: c.name, RetryAfter: res.RetryAfter, Concurrency: res})
		return
	}
	h := c.hold(r.Context(), p)
	defer h.end()
	next.ServeHTTP(w, r)
}

// holding is a request's slot while its handler runs: it renews the
// lease in the background and releases the slot when the request ends.
type holding struct {
	c *concurrency
	// ctx is the renewals' context: the request's values, not its
	// cancellation (a renewal runs while the handler does, whatever the
	// client does). end cancels it, which is what ends a renewal in flight
	// when WithTimeout(0) set no deadline; otherwise the deadline does.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	p       tollgate.Permit
	timer   *time.Timer
	ended   bool
	running sync.WaitGroup // a renewal in flight
}

func (c *concurrency) hold(reqCtx context.Context, p tollgate.Permit) *holding {
	h := &holding{c: c, p: p}
	h.ctx, h.cancel = context.WithCancel(context.WithoutCancel(reqCtx))
	h.mu.Lock()
	h.timer = time.AfterFunc(c.lease/2, h.renew)
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
func (h *holding) renew() {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.running.Add(1)
	p := h.p
	h.mu.Unlock()
	defer h.running.Done()

	c := h.c
	ctx, cancel, _ := c.deadlines.AnswerIn(h.ctx, nil)
	np, err := c.store.Renew(ctx, p, c.lease)
	cancel()
	next := c.lease / 2
	if err != nil {
		if h.ctx.Err() != nil {
			return // the request ended during the call: nothing to report
		}
		if errors.Is(err, tollgate.ErrPermitExpired) {
			c.logFailure(h.ctx, &c.renewLog, "renew", "lapsed_stop_renewing", err)
			return
		}
		c.logFailure(h.ctx, &c.renewLog, "renew", "retry", err)
		next = c.lease / 4
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

// end stops the renewals, waits for one in flight, and releases the slot
// with a context the request's end does not cancel.
func (h *holding) end() {
	h.mu.Lock()
	h.ended = true
	h.timer.Stop()
	h.mu.Unlock()
	h.cancel()
	h.running.Wait()

	c := h.c
	ctx, cancel, _ := c.deadlines.AnswerIn(context.WithoutCancel(h.ctx), nil)
	defer cancel()
	if err := c.store.Release(ctx, h.p); err != nil {
		c.logFailure(ctx, &c.releaseLog, "release", "lapses_at_lease_end", err)
	}
}

// logFailure logs a failed store call, at most once per log interval for
// each kind of call, saying how many were left out.
func (c *concurrency) logFailure(ctx context.Context, s *guard.Sampler, op, outcome string, err error) {
	ok, skipped := s.Allow(c.set.now())
	if !ok {
		return
	}
	c.set.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "tollgate: concurrency store call failed",
		slog.String("rule", c.name), slog.String("call", op), slog.String("outcome", outcome),
		slog.String("error", err.Error()), guard.Skipped(skipped))
}
