package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/guard"
	"github.com/tollgate/tollgate/internal/storekey"
)

// DefaultLease is the lease of a ConcurrencyRule that sets none: how long
// a slot stays taken after the process holding it dies. Calls that run
// longer keep theirs by renewing it.
const DefaultLease = 30 * time.Second

// ConcurrencyRule limits how many of the calls it matches run at once for
// each key: "at most 5 exports in flight per tenant". Where a Rule bounds
// how often calls start, a ConcurrencyRule bounds how many run, which is
// what protects a method whose cost is its duration (an export, a report,
// a long model completion, a stream held open). With a redisstore.Store
// the limit is shared by every replica.
type ConcurrencyRule struct {
	// Name identifies the limit in store keys, logs and the QuotaFailure
	// of a denial: 1 to 64 printable ASCII characters without ':'.
	// Required.
	Name string
	// Method limits the rule to one full method ("/pkg.Service/Method") or,
	// ending in "/*", to every method of a service ("/pkg.Service/*"); ""
	// matches all.
	Method string
	// Match, if set, must also return true for the rule to apply.
	Match func(ctx context.Context, fullMethod string) bool
	// Key says whose slots a call takes: the tenant, the user, the API
	// key. When it returns false the call is not limited. Required; for
	// one limit over every call, return the same value for all.
	Key func(ctx context.Context, fullMethod string) (string, bool)
	// Max is how many calls with one key may run at once, across every
	// process sharing the store: 1 to tollgate.MaxConcurrency.
	Max int
	// Lease is how long a slot is taken for before it lapses unless
	// renewed (zero: DefaultLease); tollgate.MinLease to tollgate.MaxLease.
	// A call still running at half its lease renews it, in the background,
	// every half lease until it ends. The lease is also how long a slot of
	// a crashed process stays taken.
	Lease time.Duration
	// FailureMode says what happens when the store fails or misses its
	// deadline: FailOpen runs the call without a slot, FailClosed fails it
	// with UNAVAILABLE and a RetryInfo; left zero, the rule fails open.
	FailureMode FailureMode
}

// ConcurrencyOption configures a ConcurrencyLimiter.
type ConcurrencyOption func(*concSettings)

// concSettings are what the ConcurrencyOptions set.
type concSettings struct {
	timeout        time.Duration
	logger         *slog.Logger
	logEvery       time.Duration
	failRetryAfter time.Duration
}

// WithConcurrencyTimeout bounds each store call (taking, renewing or
// giving back a slot) with a deadline of d (default
// enforce.DefaultTimeout, 50 ms), or the client's own deadline less a
// reserve for the answer when that comes sooner. 0 removes the deadline
// (for memorystore, which never waits).
func WithConcurrencyTimeout(d time.Duration) ConcurrencyOption {
	return func(s *concSettings) { s.timeout = d }
}

// WithConcurrencyLogger logs store failures to lg (default slog.Default()).
func WithConcurrencyLogger(lg *slog.Logger) ConcurrencyOption {
	return func(s *concSettings) { s.logger = lg }
}

// WithConcurrencyLogInterval logs store failures at most once per d for
// each kind of store call (default enforce.DefaultLogInterval, 10 s); each
// record says how many were left out. 0 logs every failure.
func WithConcurrencyLogInterval(d time.Duration) ConcurrencyOption {
	return func(s *concSettings) { s.logEvery = d }
}

// WithConcurrencyFailClosedRetryAfter sets the RetryInfo delay of the
// UNAVAILABLE a fail-closed rule answers when its store fails (default
// 1 s).
func WithConcurrencyFailClosedRetryAfter(d time.Duration) ConcurrencyOption {
	return func(s *concSettings) { s.failRetryAfter = d }
}

// ConcurrencyLimiter holds one ConcurrencyRule and makes its interceptors.
// Safe for concurrent use.
type ConcurrencyLimiter struct {
	store     tollgate.ConcurrencyStore
	name      string
	applies   func(ctx context.Context, fullMethod string) bool // nil: all calls
	key       func(ctx context.Context, fullMethod string) (string, bool)
	max       int
	lease     time.Duration
	closed    bool
	deadlines *guard.Deadlines // nil: only the call's own deadline
	set       concSettings
	// One sampler per kind of store call, so that an outage of acquires
	// does not hide the first failed renewal or release.
	acquireLog, renewLog, releaseLog guard.Sampler
}

// Concurrency returns a ConcurrencyLimiter holding the calls rule matches
// to its concurrency limit: before the handler runs, its interceptors take
// one of Max slots on the call's key from store, and they give the slot
// back when the handler returns, or panics. A stream holds its slot from
// when it opens until its handler returns. While a handler runs past half
// the lease, the slot's lease is renewed in the background every half
// lease; a renewal that fails is logged and retried sooner, and the call
// goes on.
//
// A call that finds every slot taken fails with RESOURCE_EXHAUSTED, a
// google.rpc.RetryInfo with the store's RetryAfter (when a slot frees up
// at the latest, as holders usually finish sooner) and a
// google.rpc.QuotaFailure naming the rule.
//
// When the store fails or misses its deadline on taking a slot, the rule's
// FailureMode applies: fail open runs the handler without a slot, fail
// closed answers UNAVAILABLE with a RetryInfo. A slot taken by a call
// whose answer came too late is not known here; it lapses at the end of
// its lease. Failures are logged at most once per log interval for each
// kind of store call.
//
// Chain the rate limits first, so that a client over its rate is answered
// without a store call for a slot:
//
//	grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor(), conc.UnaryServerInterceptor())
func Concurrency(store tollgate.ConcurrencyStore, rule ConcurrencyRule, opts ...ConcurrencyOption) (*ConcurrencyLimiter, error) {
	set := concSettings{timeout: enforce.DefaultTimeout, logEvery: enforce.DefaultLogInterval, failRetryAfter: time.Second}
	for _, f := range opts {
		f(&set)
	}
	if set.logger == nil {
		set.logger = slog.Default()
	}
	lease := rule.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	switch {
	case store == nil:
		return nil, errors.New("grpclimit: concurrency: nil store")
	case rule.Name == "" || len(rule.Name) > 64 || strings.ContainsFunc(rule.Name, func(c rune) bool { return c < '!' || c > '~' || c == ':' }):
		return nil, fmt.Errorf("grpclimit: concurrency rule name %q: want 1 to 64 printable ASCII characters without ':'", rule.Name)
	case rule.Key == nil:
		return nil, fmt.Errorf("grpclimit: concurrency rule %q: no Key", rule.Name)
	case rule.FailureMode != enforce.FailDefault && rule.FailureMode != FailOpen && rule.FailureMode != FailClosed:
		return nil, fmt.Errorf("grpclimit: concurrency rule %q: unknown failure mode %v", rule.Name, rule.FailureMode)
	}
	// The store checks max and lease the same way on every call; checked
	// here, a bad rule fails at start rather than on every call.
	if _, err := tollgate.CheckAcquire(rule.Name, rule.Max, lease); err != nil {
		return nil, fmt.Errorf("grpclimit: concurrency rule %q: %w", rule.Name, err)
	}
	applies, err := methodMatcher(rule.Method, rule.Match)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: concurrency rule %q: %w", rule.Name, err)
	}
	c := &ConcurrencyLimiter{
		store: store, name: rule.Name, applies: applies, key: rule.Key, max: rule.Max, lease: lease,
		closed: rule.FailureMode == FailClosed, set: set,
	}
	if set.timeout > 0 {
		c.deadlines = guard.NewDeadlines(set.timeout)
	}
	c.acquireLog.Every, c.renewLog.Every, c.releaseLog.Every = set.logEvery, set.logEvery, set.logEvery
	return c, nil
}

// UnaryServerInterceptor holds each unary call to the limit while its
// handler runs.
func (c *ConcurrencyLimiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		h, err := c.acquire(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		defer h.end()
		return handler(ctx, req)
	}
}

// StreamServerInterceptor holds each stream to the limit from when it
// opens until its handler returns.
func (c *ConcurrencyLimiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		h, err := c.acquire(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		defer h.end()
		return handler(srv, ss)
	}
}

// storeKey returns the store key of a call whose key is value:
// "<rule>:<value>", hashed as the rules' keys are when too long.
func (c *ConcurrencyLimiter) storeKey(value string) string {
	b := make([]byte, 0, len(c.name)+1+len(value))
	b = append(append(append(b, c.name...), ':'), value...)
	return storekey.String(b, len(c.name)+1)
}

// acquire takes a slot for a call and returns its holding (nil when the
// call runs without a slot: the rule does not apply, or failed open), or
// the status error the call fails with.
func (c *ConcurrencyLimiter) acquire(ctx context.Context, method string) (*holding, error) {
	if c.applies != nil && !c.applies(ctx, method) {
		return nil, nil
	}
	value, ok := c.key(ctx, method)
	if !ok {
		return nil, nil
	}
	actx, cancel, _ := c.deadlines.AnswerIn(ctx, nil)
	p, res, err := c.store.Acquire(actx, c.storeKey(value), c.max, c.lease)
	cancel()
	switch {
	case err != nil && c.closed:
		c.logFailure(ctx, &c.acquireLog, "acquire", "fail_closed", err)
		st := status.New(codes.Unavailable, "grpclimit: concurrency limiter unavailable (rule "+strconv.Quote(c.name)+" fails closed)")
		return nil, withDetails(st, &errdetails.RetryInfo{RetryDelay: durationpb.New(c.set.failRetryAfter)})
	case err != nil:
		c.logFailure(ctx, &c.acquireLog, "acquire", "fail_open", err)
		return nil, nil
	case !res.Allowed:
		st := status.New(codes.ResourceExhausted, "grpclimit: concurrency limit "+strconv.Quote(c.name)+" reached; retry in "+res.RetryAfter.String()+" at the latest")
		return nil, withDetails(st,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)},
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
				Subject:     "rule:" + c.name,
				Description: "concurrency limit reached: " + strconv.Itoa(res.Max) + " in flight",
			}}})
	}
	return c.hold(ctx, p), nil
}

// withDetails returns st with details as its error.
func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil {
		st = d
	}
	return st.Err()
}

// holding is a call's slot while its handler runs: it renews the lease in
// the background and releases the slot when the call ends. A nil holding
// holds nothing.
type holding struct {
	c *ConcurrencyLimiter
	// ctx is the renewals' context: the call's values, not its
	// cancellation (a renewal runs while the handler does, whatever the
	// client does). end cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	p       tollgate.Permit
	timer   *time.Timer
	ended   bool
	running sync.WaitGroup // a renewal in flight
}

func (c *ConcurrencyLimiter) hold(callCtx context.Context, p tollgate.Permit) *holding {
	h := &holding{c: c, p: p}
	h.ctx, h.cancel = context.WithCancel(context.WithoutCancel(callCtx))
	h.mu.Lock()
	h.timer = time.AfterFunc(c.lease/2, h.renew)
	h.mu.Unlock()
	return h
}

// renew runs on the timer: it extends the lease and sets the timer for
// the next renewal, half a lease later, or a quarter lease after a failed
// renewal, which leaves one more try before the lease ends. Half a lease
// leaves a late or slow renewal the other half to land in, and a call
// shorter than half its lease makes no renewal at all. A permit found
// lapsed is not renewed again: its slot may be someone else's now.
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
			return // the call ended during the renewal: nothing to report
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
// with a context the call's end does not cancel.
func (h *holding) end() {
	if h == nil {
		return
	}
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
func (c *ConcurrencyLimiter) logFailure(ctx context.Context, s *guard.Sampler, op, outcome string, err error) {
	ok, skipped := s.Allow(time.Now())
	if !ok {
		return
	}
	c.set.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "tollgate: concurrency store call failed",
		slog.String("rule", c.name), slog.String("call", op), slog.String("outcome", outcome),
		slog.String("error", err.Error()), guard.Skipped(skipped))
}
