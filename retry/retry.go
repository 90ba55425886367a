// Package retry is the client side of rate limits: an http.RoundTripper that
// retries 429 and 503 responses the way servers ask — after Retry-After, or
// the draft RateLimit field's t — and otherwise with exponential backoff and
// full jitter; and an outbound limiter (Outbound) that keeps many replicas
// together under an outside provider's quota.
//
//	client := &http.Client{Transport: retry.NewTransport(
//		retry.NewOutbound(http.DefaultTransport, lim, "provider:stripe", tollgate.PerMinute(100)),
//	)}
//
// # When it retries
//
// Only requests that can safely be sent twice: idempotent methods (GET,
// HEAD, OPTIONS, TRACE, PUT, DELETE) or any request with an Idempotency-Key
// header, and only when the body can be replayed (no body, or GetBody set,
// as http.NewRequest does for in-memory bodies). Network errors are not
// retried: the request may have been processed.
//
// # How long it waits
//
//   - Retry-After, in seconds or as an HTTP date, when the response has it;
//   - else the t parameter of a RateLimit item whose r is 0 (the longest,
//     if several are exhausted);
//   - else a full-jitter backoff: a uniformly random wait between 0 and
//     min(MaxDelay, BaseDelay × 2^retry). The randomness spreads clients
//     that were rejected together, instead of sending them back in a
//     synchronized storm.
//
// It gives up — and returns the last response as it is — after
// MaxAttempts, or when the wait would end past MaxElapsed since the first
// attempt or past the request context's deadline: waiting in vain helps
// nobody. A context that ends during a wait ends the request with its
// error.
package retry

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/tollgate/tollgate"
)

// Defaults of a Transport, as the options' docs give them.
const (
	defaultMaxAttempts = 4
	defaultMaxElapsed  = 30 * time.Second
	defaultBaseDelay   = 100 * time.Millisecond
	defaultMaxDelay    = 10 * time.Second
)

// Transport retries rate-limited requests. Make one with NewTransport; it is
// safe for concurrent use.
type Transport struct {
	base          http.RoundTripper
	maxAttempts   int
	maxElapsed    time.Duration
	baseDelay     time.Duration
	maxDelay      time.Duration
	statuses      map[int]bool
	nonIdempotent bool
	now           func() time.Time
	sleep         func(context.Context, time.Duration) error
	random        func(n int64) int64
}

// Option configures a Transport.
type Option func(*options)

// options are what the Options set: the Transport being made.
type options struct{ t Transport }

// WithMaxAttempts sets how many times a request is sent at most, the first
// included (default 4). 1 disables retries.
func WithMaxAttempts(n int) Option { return func(o *options) { o.t.maxAttempts = max(1, n) } }

// WithMaxElapsed sets the longest time from the first attempt to the start
// of the last (default 30 s); 0 means no limit but the context's.
func WithMaxElapsed(d time.Duration) Option { return func(o *options) { o.t.maxElapsed = d } }

// WithBackoff sets the backoff when the server gives no hint: retry k waits
// a random time in [0, min(maxDelay, base × 2^(k-1))] (defaults 100 ms and
// 10 s).
func WithBackoff(base, maxDelay time.Duration) Option {
	return func(o *options) { o.t.baseDelay, o.t.maxDelay = base, maxDelay }
}

// WithStatuses sets the response statuses that are retried (default 429
// and 503).
func WithStatuses(codes ...int) Option {
	return func(o *options) {
		o.t.statuses = map[int]bool{}
		for _, c := range codes {
			o.t.statuses[c] = true
		}
	}
}

// RetryNonIdempotent retries every method, POST and PATCH included. Only for
// servers that do nothing with a request they answer 429 or 503 to.
func RetryNonIdempotent() Option { return func(o *options) { o.t.nonIdempotent = true } }

// WithSleep replaces how the transport waits before a retry (default: a
// timer): sleep waits d or until ctx ends, and returns ctx's error if it
// ended first. Tests and simulations pass one that advances their clock.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(o *options) { o.t.sleep = sleep }
}

// NewTransport returns a Transport sending requests with base
// (http.DefaultTransport when nil).
func NewTransport(base http.RoundTripper, opts ...Option) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	o := options{t: Transport{
		base:        base,
		maxAttempts: defaultMaxAttempts,
		maxElapsed:  defaultMaxElapsed,
		baseDelay:   defaultBaseDelay,
		maxDelay:    defaultMaxDelay,
		statuses:    map[int]bool{http.StatusTooManyRequests: true, http.StatusServiceUnavailable: true},
		now:         time.Now,
		sleep:       sleep,
		random:      rand.Int64N,
	}}
	for _, opt := range opts {
		opt(&o)
	}
	return &o.t
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.retryable(req) {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	start := t.now()
	for attempt := 1; ; attempt++ {
		r := req
		if attempt > 1 {
			r = req.Clone(ctx)
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, fmt.Errorf("retry: replay the request body: %w", err)
				}
				r.Body = body
			}
		}
		resp, err := t.base.RoundTrip(r)
		if err != nil || !t.statuses[resp.StatusCode] || attempt >= t.maxAttempts {
			return resp, err
		}
		wait := t.delay(resp, attempt)
		now := t.now()
		if t.maxElapsed > 0 && now.Add(wait).Sub(start) > t.maxElapsed {
			return resp, nil // the retry would start too late
		}
		if dl, ok := ctx.Deadline(); ok && now.Add(wait).After(dl) {
			return resp, nil // the context would end first
		}
		drain(resp.Body)
		if err := t.sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("retry: waiting %v to retry %s %s: %w", wait, req.Method, req.URL.Redacted(), err)
		}
	}
}

// retryable reports whether req may be sent more than once.
func (t *Transport) retryable(req *http.Request) bool {
	if t.maxAttempts < 2 {
		return false
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false // the body cannot be sent again
	}
	if t.nonIdempotent {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	// As net/http does for its own retries: the key makes a repeat harmless.
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// delay returns how long to wait before retry number attempt: the server's
// hint if it gave one, else full-jitter backoff.
func (t *Transport) delay(resp *http.Response, attempt int) time.Duration {
	if d, ok := RetryAfter(resp.Header, t.now()); ok {
		return d
	}
	if d, ok := RateLimitReset(resp.Header); ok {
		return d
	}
	ceiling := t.maxDelay
	if shift := attempt - 1; shift < 62 && t.baseDelay<<shift > 0 && t.baseDelay<<shift < ceiling {
		ceiling = t.baseDelay << shift
	}
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(t.random(int64(ceiling) + 1))
}

// RetryAfter parses the Retry-After field of h: delta-seconds, or an HTTP
// date relative to now (a date in the past means 0). It reports false when
// the field is missing or malformed.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(time.Duration(1<<62)/time.Second))) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, at.Sub(now)), true
}

// RateLimitReset reads the draft RateLimit field of h and returns the
// longest t among the items whose r is 0: how long until every exhausted
// policy has quota again. It reports false when no policy is exhausted or
// the field is missing or malformed (which the draft says to ignore).
func RateLimitReset(h http.Header) (time.Duration, bool) {
	values := h.Values("RateLimit")
	if len(values) == 0 {
		return 0, false
	}
	list, err := httpsfv.UnmarshalList(values)
	if err != nil {
		return 0, false
	}
	var longest int64 = -1
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok || it.Params == nil {
			continue
		}
		r, _ := it.Params.Get("r")
		t, _ := it.Params.Get("t")
		rv, rok := r.(int64)
		tv, tok := t.(int64)
		if rok && tok && rv == 0 && tv >= 0 && tv > longest {
			longest = tv
		}
	}
	if longest < 0 {
		return 0, false
	}
	return time.Duration(min(longest, int64(time.Duration(1<<62)/time.Second))) * time.Second, true
}

// drain reads a little of a response we are about to drop, so that its
// connection can be reused, and closes it.
func drain(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, 64<<10)
	_ = body.Close()
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// Outbound is an http.RoundTripper that waits for a slot of a shared limit
// before sending each request, so that every replica together stays under
// an outside provider's quota: with a redisstore Limiter, 100 requests a
// minute means 100 across all pods, not 100 per pod.
type Outbound struct {
	base  http.RoundTripper
	lim   *tollgate.Limiter
	limit tollgate.Limit
	key   string
}

// NewOutbound returns an Outbound sending with base (http.DefaultTransport
// when nil) after lim.Wait(ctx, key, limit) for each request. A shaping
// LeakyBucket (MaxDelay > 0) makes every request reserve its own slot in
// one store call, which is fairest under contention; a token bucket lets
// replicas that wake together race for the next token. For a quota per
// provider host, make an Outbound for each.
func NewOutbound(base http.RoundTripper, lim *tollgate.Limiter, key string, limit tollgate.Limit) *Outbound {
	if base == nil {
		base = http.DefaultTransport
	}
	return &Outbound{base: base, lim: lim, limit: limit, key: key}
}

// RoundTrip waits for a slot, then sends req. When the wait fails — the
// context ends, its deadline comes before the slot
// (tollgate.ErrWaitExceedsDeadline), or the store fails — req is not sent.
func (o *Outbound) RoundTrip(req *http.Request) (*http.Response, error) {
	key := o.key
	if err := o.lim.Wait(req.Context(), key, o.limit); err != nil {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper closes the body, even on error
		}
		return nil, fmt.Errorf("retry: outbound quota %q: %w", key, err)
	}
	return o.base.RoundTrip(req)
}
