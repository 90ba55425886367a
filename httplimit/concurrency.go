package httplimit

import (
	"fmt"
	"net/http"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/ruleset"
)

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
	// renewed (zero: 30 s); tollgate.MinLease to tollgate.MaxLease.
	// A request still running at half its lease renews it, in the
	// background, every half lease until it ends. The lease is also how
	// long a slot of a crashed process stays taken.
	Lease time.Duration
	// FailureMode says what happens when the store fails or misses its
	// deadline: FailOpen runs the request without a slot, FailClosed
	// answers 503 with Retry-After; left zero, the rule fails open.
	FailureMode enforce.FailureMode
}

// concurrency is one ConcurrencyRule, ready to serve.
type concurrency struct {
	slots  *ruleset.Slots
	pat    *pattern
	match  func(*http.Request) bool
	key    func(*http.Request) (string, bool)
	reject func(http.ResponseWriter, *http.Request, Rejection)
}

// Concurrency returns a Limiter that holds each request the rule matches
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
// Each store call is bounded as enforce.WithTimeout says (50 ms by default). When
// the store fails or misses that deadline on taking a slot, the rule's
// FailureMode applies: fail open runs the handler without a slot, fail
// closed answers 503 with enforce.WithFailClosedRetryAfter's Retry-After. A slot
// taken by a call whose answer came too late is not known here; it lapses
// at the end of its lease. Failures are logged (enforce.WithLogger), at most once
// per enforce.WithLogInterval for each kind of call. The other options do not
// apply; no metrics are recorded.
//
// Put the rate limits first, lim.Handler(conc.Handler(mux)), so that a client
// over its rate is answered without a store call for a slot.
func Concurrency(store tollgate.ConcurrencyStore, rule ConcurrencyRule, opts ...enforce.Option) (*Limiter, error) {
	c, err := newConcurrency(store, rule, opts)
	if err != nil {
		return nil, err
	}
	return &Limiter{conc: c}, nil
}

func newConcurrency(store tollgate.ConcurrencyStore, rule ConcurrencyRule, opts []enforce.Option) (*concurrency, error) {
	set := ruleset.Resolve(opts)
	slots, err := ruleset.NewSlots("httplimit", store, rule.Name, rule.Max, rule.Lease, rule.FailureMode, set)
	if err != nil {
		return nil, err
	}
	if rule.Key == nil {
		return nil, fmt.Errorf("httplimit: concurrency rule %q: no Key", rule.Name)
	}
	c := &concurrency{slots: slots, match: rule.Match, key: rule.Key, reject: rejecter(set)}
	if rule.Pattern != "" {
		if c.pat, err = parsePattern(rule.Pattern); err != nil {
			return nil, fmt.Errorf("httplimit: concurrency rule %q: %w", rule.Name, err)
		}
	}
	return c, nil
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
	h, res, outcome, err := c.slots.Take(r.Context(), value)
	name := c.slots.Name()
	switch outcome {
	case engine.FailedClosed:
		ra := c.slots.FailClosedRetryAfter()
		headers.SetRetryAfter(w.Header(), ra)
		c.reject(w, r, Rejection{Status: http.StatusServiceUnavailable, Rule: name, RetryAfter: ra, Err: err})
		return
	case engine.FailedOpen:
		next.ServeHTTP(w, r)
		return
	case engine.Denied:
		headers.SetRetryAfter(w.Header(), res.RetryAfter)
		c.reject(w, r, Rejection{Status: http.StatusTooManyRequests, Rule: name, Policy: name, RetryAfter: res.RetryAfter, Concurrency: res})
		return
	}
	defer h.End()
	next.ServeHTTP(w, r)
}
