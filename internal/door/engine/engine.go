package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/store/calendar"
)

// Engine is the one step behind every door: httplimit's and grpclimit's
// rules (Rules) and the decision service (internal/service) spend a limit for
// a key through it, and nothing else calls the store to decide. Around the
// store call it puts what a decision needs wherever it comes from:
//
//   - a deadline: the sooner of the engine's timeout and the caller's own
//     deadline less a reserve for the answer (Deadlines.AnswerIn),
//     shared by every store call of one request (Request), and when the
//     engine's timeout comes first, by the requests that start at about
//     the same time;
//   - a cost above what the limit can ever admit is denied without a store
//     call (tollgate.ErrCostExceedsBurst), so a sliding log never writes an
//     entry per hit of a request that cannot pass;
//   - the rule's failure mode when the store fails or the deadline passes,
//     and no further store call for a request whose deadline has passed, so
//     one slow request counts one timeout however many limits it spends;
//   - dry run (shadow mode): decided and reported, never blocking;
//   - for a cost known only after the response, a reservation (Reserve,
//     through the store's ReserveN) and its correction (Settle), the
//     settle bounded, counted and logged as every store call is;
//   - store latency, errors and skipped calls in the caller's metrics
//     (Point), and failures logged at most once per log interval.
//
// Store keys are made by each door (their namespaces differ) and hashed
// when too long by one function, internal/storekey.
type Engine struct {
	store     tollgate.Store
	settler   tollgate.Settler // store, if it can settle; nil otherwise
	combiner  bool             // store is a tollgate.Combiner
	deadlines *Deadlines       // nil: no deadline of the engine's own
	logger    *slog.Logger
	now       func() time.Time
	failLog   Sampler
	pending   pending // store calls running after their response (Later)
}

// NewEngine returns an Engine spending in store. timeout bounds each
// request's store calls (0: only the caller's deadline does); failures are
// logged to logger at most once per logEvery, paced by now.
func NewEngine(store tollgate.Store, timeout time.Duration, logger *slog.Logger, logEvery time.Duration, now func() time.Time) *Engine {
	e := &Engine{store: store, logger: logger, now: now}
	e.settler, _ = store.(tollgate.Settler)
	_, e.combiner = store.(tollgate.Combiner)
	e.failLog.Every = logEvery
	if timeout > 0 {
		e.deadlines = NewDeadlines(timeout)
	}
	return e
}

// Point is what the engine knows of the rule it spends for: set once per
// rule and reused.
type Point struct {
	// Rule names the rule in failure logs.
	Rule string
	// Mode is enforce.FailOpen or enforce.FailClosed (FailDefault fails open).
	Mode enforce.FailureMode
	// DryRun rules never block: a denial is DryRunDenied, a store failure
	// FailedOpen.
	DryRun bool
	// Latency observes each store call; Errors counts failed calls and
	// Timeouts those that missed the deadline (Errors if nil); Skipped
	// counts calls not made because the request's deadline had passed.
	// Any may be nil.
	Latency  prometheus.Observer
	Errors   prometheus.Counter
	Timeouts prometheus.Counter
	Skipped  prometheus.Counter
}

// Step is the outcome of one spend.
type Step struct {
	// Outcome is Allowed, Denied, DryRunDenied, FailedOpen or FailedClosed.
	Outcome Outcome
	// Result is the store's answer; after a failure, only its Limit is set.
	Result tollgate.Result
	// Err is why the store did not decide (FailedOpen, FailedClosed), or
	// for a denial, tollgate.ErrCostExceedsBurst when the cost exceeds what
	// the limit can ever admit.
	Err error
}

// Request is one request's way through the engine: its store calls share
// one deadline, armed on the first call, so requests that make none take
// nothing from the shared timer. Make it with Begin and call End when done.
type Request struct {
	e        *Engine
	ctx      context.Context
	cancel   context.CancelFunc
	room     *Room // where to make the shared deadline's context; nil: a new one
	armed    bool
	timedOut atomic.Bool // a timeout of this request has been counted
}

// Begin starts a request whose caller's context is ctx.
func (e *Engine) Begin(ctx context.Context) Request { return Request{e: e, ctx: ctx} }

// BeginIn is Begin, making the context of the request's store calls in
// room when the shared deadline serves: a caller that already allocates
// memory of its own per request (the service, its response) keeps room
// there and saves an allocation a request. room must not be used by
// another request while this one may still use its context; nil makes a
// new one, as Begin.
func (e *Engine) BeginIn(ctx context.Context, room *Room) Request {
	return Request{e: e, ctx: ctx, room: room}
}

// UseRoom makes the context of the request's store calls in room, as
// BeginIn does, for a caller that has room only once it knows the request
// will call the store. It must come before the first store call.
func (q *Request) UseRoom(room *Room) { q.room = room }

// End releases the request's deadline.
func (q *Request) End() {
	if q.cancel != nil {
		q.cancel()
	}
}

// Context arms the request's deadline, if it is not yet armed, and
// returns the context of its store calls. Once it is armed, Spend may be
// called from several goroutines at once (a request's descriptors decided
// together); before, a Request is for one goroutine.
func (q *Request) Context() context.Context {
	ctx, _ := q.context()
	return ctx
}

// context returns the context of the request's store calls, and whether
// it was armed just now on the shared deadline, which leaves the calls at
// least the engine's timeout: then it has not expired, and Spend need not
// read the clock again to know.
func (q *Request) context() (ctx context.Context, fresh bool) {
	if q.armed {
		return q.ctx, false
	}
	q.armed = true
	q.ctx, q.cancel, fresh = q.e.deadlines.AnswerIn(q.ctx, q.room)
	return q.ctx, fresh
}

// Spend spends n (0 looks) of l for key on behalf of the rule at p, whose
// policy (if it has named ones) is named in failure logs.
func (q *Request) Spend(p *Point, policy, key string, l tollgate.Limit, n int) Step {
	st, _ := q.spend(p, policy, key, l, n, false)
	return st
}

// Reserve spends n of l for key as Spend does, through the store's
// ReserveN, and also returns the store's clock at the decision: what
// Settle needs to correct the spend once the request's real cost is known.
// at is meaningful only when the Step is Allowed: the only outcome that
// spent n (a denial, dry run or not, spends nothing). The engine's store must be a
// tollgate.Settler (Settles); with another the Step is a failure.
func (q *Request) Reserve(p *Point, policy, key string, l tollgate.Limit, n int) (st Step, at int64) {
	return q.spend(p, policy, key, l, n, true)
}

// Settles reports whether the engine's store is a tollgate.Settler, so
// that Reserve and Settle can be used.
func (e *Engine) Settles() bool { return e.settler != nil }

// Combines reports whether the engine's store is a tollgate.Combiner, so
// that SpendAll can be used.
func (e *Engine) Combines() bool { return e.combiner }

// window is l's period, or a calendar window's nominal length.
func window(l tollgate.Limit) time.Duration {
	if d := calendar.Nominal(l.Calendar.Unit); d > 0 {
		return d
	}
	return l.Period
}

// capacityBelow returns l's Capacity when a cost of n exceeds it, and 0
// otherwise (a cost it can admit at once, or an invalid limit, which is
// the store's to refuse). A cost of 1 or less never exceeds a valid
// limit's capacity, which is at least 1: it is answered without reading
// the capacity, a lookup in the limits' cache on every request.
func capacityBelow(l tollgate.Limit, n int) int {
	if n <= 1 {
		return 0
	}
	if c := l.Capacity(); c > 0 && n > c {
		return c
	}
	return 0
}

// spend is Spend, or Reserve when reserve is set.
func (q *Request) spend(p *Point, policy, key string, l tollgate.Limit, n int, reserve bool) (Step, int64) {
	if c := capacityBelow(l, n); c > 0 {
		// Over whatever the counter holds, and waiting will not help: the
		// longest honest wait.
		err := fmt.Errorf("%w: cost %d, but %s admits at most %d at once", tollgate.ErrCostExceedsBurst, n, l, c)
		return Step{Outcome: deny(p), Result: tollgate.Result{Limit: l, RetryAfter: window(l)}, Err: err}, 0
	}
	ctx, fresh := q.context()
	if !fresh && expired(ctx) {
		// A store call of this request timed out, or the caller is gone.
		if p.Skipped != nil {
			p.Skipped.Inc()
		}
		return q.fail(ctx, p, policy, l, context.DeadlineExceeded, false), 0
	}
	var start time.Time
	if p.Latency != nil {
		start = time.Now()
	}
	var (
		res tollgate.Result
		at  int64
		err error
	)
	switch {
	case !reserve:
		res, err = q.e.store.AllowN(ctx, key, l, n)
	case q.e.settler != nil:
		res, at, err = q.e.settler.ReserveN(ctx, key, l, n)
	default:
		err = fmt.Errorf("%T cannot settle reservations", q.e.store)
	}
	if p.Latency != nil {
		p.Latency.Observe(time.Since(start).Seconds())
	}
	switch {
	case err == nil:
	case errors.Is(err, tollgate.ErrCostExceedsBurst):
		// A store that counts capacity its own way: the same answer.
		return Step{Outcome: deny(p), Result: tollgate.Result{Limit: l, RetryAfter: window(l)}, Err: err}, 0
	default:
		return q.fail(ctx, p, policy, l, err, true), 0
	}
	if res.Allowed {
		return Step{Outcome: Allowed, Result: res}, at
	}
	return Step{Outcome: deny(p), Result: res}, at
}

// SpendAll spends n (at least 1) of every one of ls for key on behalf of
// the rule at p, all or nothing, in one store call (tollgate.Combiner):
// the request is admitted only if every limit admits it, and a denied one
// spends none of them. It appends one Step per limit to dst: each limit's
// own answer (an admission, a denial, or for a limit that would have
// admitted a denied request, what it has left, unspent). policy names the
// set in failure logs.
//
// A limit that can never admit n denies with tollgate.ErrCostExceedsBurst
// without a store call; the others' Steps are then Allowed with only their
// Limit set, nothing spent. When the store fails, or is no
// tollgate.Combiner, every Step is the rule's failure mode.
func (q *Request) SpendAll(p *Point, policy, key string, ls []tollgate.Limit, n int, dst []Step) []Step {
	start := len(dst)
	over := false
	for _, l := range ls {
		st := Step{Outcome: Allowed, Result: tollgate.Result{Limit: l}}
		if c := capacityBelow(l, n); c > 0 {
			err := fmt.Errorf("%w: cost %d, but %s admits at most %d at once", tollgate.ErrCostExceedsBurst, n, l, c)
			st = Step{Outcome: deny(p), Result: tollgate.Result{Limit: l, RetryAfter: window(l)}, Err: err}
			over = true
		}
		dst = append(dst, st)
	}
	if over {
		return dst
	}
	failAll := func(st Step) []Step {
		for i := range ls {
			st.Result = tollgate.Result{Limit: ls[i]}
			dst[start+i] = st
		}
		return dst
	}
	c, ok := q.e.store.(tollgate.Combiner)
	ctx, fresh := q.context()
	switch {
	case !ok:
		return failAll(q.fail(ctx, p, policy, ls[0], fmt.Errorf("%T cannot decide limits together", q.e.store), true))
	case !fresh && expired(ctx):
		if p.Skipped != nil {
			p.Skipped.Inc()
		}
		return failAll(q.fail(ctx, p, policy, ls[0], context.DeadlineExceeded, false))
	}
	var t time.Time
	if p.Latency != nil {
		t = time.Now()
	}
	var buf [4]tollgate.Result
	rs, err := c.AllowAll(ctx, key, ls, n, buf[:0])
	if p.Latency != nil {
		p.Latency.Observe(time.Since(t).Seconds())
	}
	if err != nil {
		return failAll(q.fail(ctx, p, policy, ls[0], err, true))
	}
	for i, r := range rs {
		dst[start+i] = Step{Outcome: Allowed, Result: r}
		if !r.Allowed {
			dst[start+i].Outcome = deny(p)
		}
	}
	return dst
}

// Settle corrects what the reservation of reserved, made by Reserve on key
// under l at the store's clock at, spent, by actual − reserved (see
// tollgate.Settler), on behalf of the rule at p. It is a store call like
// any other: bounded by the request's deadline, which Begin must have been
// given a context the end of the request does not cancel
// (context.WithoutCancel), and when the store fails or misses the
// deadline, counted in p's Errors or Timeouts and logged (sampled). Its
// error is for tests: the request it corrects has already been answered,
// and the estimate stands.
func (q *Request) Settle(p *Point, policy, key string, l tollgate.Limit, at int64, reserved, actual int) error {
	if actual == reserved {
		return nil // nothing to correct
	}
	if q.e.settler == nil {
		return fmt.Errorf("%T cannot settle reservations", q.e.store)
	}
	return q.Call(p, policy, "estimate_stands", "tollgate: store failed to settle a reservation; the estimate stands", func(ctx context.Context) error {
		_, err := q.e.settler.SettleN(ctx, key, l, at, reserved, actual)
		return err
	})
}

// Charge spends n of l for key on behalf of the rule at p after the fact,
// with no reservation before it — a settle of reserved 0 (see
// tollgate.Settler): even past what is left, into a debt of at most the
// limit's MaxDebt that later requests wait out, so that a cost reported
// once the work is done counts whatever the key had left. It returns the
// key's state after the charge as a look reports it. It is a store call as
// Call makes it, its failure logged with outcome.
func (q *Request) Charge(p *Point, policy, outcome, key string, l tollgate.Limit, n int) (tollgate.Result, error) {
	res := tollgate.Result{Limit: l}
	if q.e.settler == nil {
		return res, fmt.Errorf("%T cannot charge after the fact", q.e.store)
	}
	err := q.Call(p, policy, outcome, "tollgate: store failed; answered by the rule's failure mode", func(ctx context.Context) (err error) {
		res, err = q.e.settler.SettleN(ctx, key, l, 0, 0, n)
		return err
	})
	return res, err
}

// Call makes a store call other than a decision (a concurrency slot taken
// or given back, a settle) on behalf of the rule at p, as every store call
// is made: under the request's deadline (not made once it has passed,
// counted in p's Skipped), timed in p's Latency, and when it fails counted
// in p's Errors or Timeouts and logged (sampled) as msg, with outcome
// naming what the caller does instead. It returns call's error, or the
// deadline's.
func (q *Request) Call(p *Point, policy, outcome, msg string, call func(context.Context) error) error {
	ctx, fresh := q.context()
	if !fresh && expired(ctx) {
		if p.Skipped != nil {
			p.Skipped.Inc()
		}
		return context.DeadlineExceeded
	}
	var start time.Time
	if p.Latency != nil {
		start = time.Now()
	}
	err := call(ctx)
	if p.Latency != nil {
		p.Latency.Observe(time.Since(start).Seconds())
	}
	if err != nil {
		q.report(ctx, p, policy, outcome, err, msg)
	}
	return err
}

func deny(p *Point) Outcome {
	if p.DryRun {
		return DryRunDenied
	}
	return Denied
}

// fail answers a store call that failed (called) or was not made by p's
// failure mode, counts it and logs it (sampled). The key is not logged: it
// may be an API key.
func (q *Request) fail(ctx context.Context, p *Point, policy string, l tollgate.Limit, err error, called bool) Step {
	st := Step{Outcome: FailedOpen, Result: tollgate.Result{Limit: l}, Err: err}
	if p.Mode == enforce.FailClosed && !p.DryRun {
		st.Outcome = FailedClosed
	}
	if !called {
		return st
	}
	q.report(ctx, p, policy, st.Outcome.String(), err, "tollgate: store failed; answered by the rule's failure mode")
	return st
}

// report counts a failed store call of the rule at p in its Errors, or
// Timeouts when the deadline passed (once per request, even when its calls
// were made at once), and logs it, sampled, as msg with outcome saying what
// was done instead.
func (q *Request) report(ctx context.Context, p *Point, policy, outcome string, err error, msg string) {
	e := q.e
	c := p.Errors
	if IsTimeout(ctx, err) {
		if q.timedOut.Swap(true) {
			return
		}
		if p.Timeouts != nil {
			c = p.Timeouts
		}
	}
	if c != nil {
		c.Inc()
	}
	ok, skipped := e.failLog.Allow(e.now())
	if !ok {
		return
	}
	attrs := []slog.Attr{slog.String("rule", p.Rule)}
	if policy != "" {
		attrs = append(attrs, slog.String("policy", policy))
	}
	attrs = append(attrs, slog.String("outcome", outcome), slog.String("error", err.Error()), Skipped(skipped))
	// WithoutCancel: the record must not be dropped by a handler that
	// checks the (probably expired) request context.
	e.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, msg, attrs...)
}

// expired reports whether ctx is done or past its deadline. The store
// sees the deadline (go-redis sets it on the socket) and can give up at it
// before the shared timer of Deadlines marks ctx done, up to a
// millisecond later.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// IsTimeout reports whether err, from a store call under ctx, is the
// deadline passing rather than the store failing.
func IsTimeout(ctx context.Context, err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Later runs f on a goroutine of its own, for store calls made after the
// response (a settle): Drain waits for it.
func (e *Engine) Later(f func()) {
	e.pending.add()
	go func() {
		defer e.pending.done()
		f()
	}()
}

// Drain waits until the calls started with Later have returned, or until
// ctx ends (its error then).
func (e *Engine) Drain(ctx context.Context) error { return e.pending.wait(ctx) }
