// Package httplimit is rate-limiting middleware for net/http: it checks
// every request against rules before the handler runs, sets the rate-limit
// headers on every response, and answers 429 with Retry-After and an
// RFC 9457 problem body when a limit is hit.
//
//	lim, err := httplimit.New(store, []httplimit.Rule{{
//		Name:     "api",
//		Policies: []enforce.Policy{{Name: "burst", Limit: tollgate.PerSecond(10)}, {Name: "daily", Limit: tollgate.PerDay(10000)}},
//	}}, enforce.WithClientIP(clientip.MustNew(clientip.TrustProxies("10.0.0.0/8"))))
//	http.ListenAndServe(":8080", lim.Handler(mux))
//
// Limiter.Handler has the shape func(http.Handler) http.Handler, so it wraps
// a ServeMux, goes into chi's Use, or wraps one handler.
//
// # Rules
//
// A Rule matches requests (a ServeMux-style Pattern such as "POST /login",
// and/or a Match func), keys them (Key: the client's address by default, or
// a header, a user, a tenant, the route, everyone, or a composite), and
// checks one or more Policies — named limits, such as 10/s and 10,000/day —
// or a PoliciesFunc that picks them per request (free vs pro plans). Every
// rule that matches a request applies, in order; the first denial stops the
// checks, so a denied request does not spend the quotas checked after it.
// Put short windows first.
//
// A rule's FailureMode says what happens when the store fails or misses its
// deadline (enforce.WithTimeout, 50 ms by default): FailOpen lets the request
// through, FailClosed answers 503 with Retry-After. Every failure is counted
// and logged, at most once per log interval. A DryRun rule counts, reports
// and logs what it would have done, and never blocks.
//
// A policy that is a LeakyBucket with MaxDelay shapes instead of rejecting:
// the request waits its turn (Result.Delay), bounded by the request's
// context, before the handler runs.
//
// # Costs known after the response
//
// A Rule with Settle reserves its Cost as an estimate and corrects it once
// the handler has returned, by the real cost the response reports: a
// header or trailer the handler sets (the tokens of an LLM completion, the
// bytes or rows served), a function of the status and headers, or a refund
// by status (a 5xx the client did not cause). A refund gives the estimate
// back; a cost above the estimate is charged too, below zero if need be,
// and the key's next requests wait out the debt. The rate-limit headers of
// such a response describe the reservation. See Settle.
//
// # Concurrency limits
//
// Concurrency returns a Limiter that bounds how many
// requests run at once per key, across every replica sharing a
// tollgate.ConcurrencyStore: "at most 5 exports in flight per tenant". It
// takes a leased slot before the handler runs, renews the lease while the
// handler runs long, and gives the slot back when the handler returns or
// panics; a request that finds every slot taken gets 429 with Retry-After.
//
// What a rule means at every door — Policy, FailureMode — and the options
// New and Concurrency take live in package enforce; the headers in
// headers; client addresses in clientip.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/ruleset"
	"github.com/tollgate/tollgate/internal/door/settings"
)

// Rule says which requests to limit, by what key, under which limits, and
// what to do when the store fails.
type Rule struct {
	// Name identifies the rule in store keys, metrics and logs: 1 to 64
	// printable ASCII characters without ':'. Required and unique.
	Name string
	// Pattern, in net/http.ServeMux syntax ("POST /login",
	// "GET /users/{id}", "/api/", "api.example.com/"), limits the rule to
	// the requests it matches; "" matches all. Unlike ServeMux, every rule
	// that matches applies, not just the most specific.
	Pattern string
	// Match, if set, must also return true for the rule to apply.
	Match func(*http.Request) bool
	// Key says whom a request is counted against; the zero Key is the
	// client's address.
	Key Key
	// Policies are the limits, checked in order. Two policies of one rule
	// must differ in algorithm or period.
	Policies []enforce.Policy
	// PoliciesFunc, if set, picks the policies per request instead (per
	// plan or per tenant); nil or empty means the rule does not apply.
	PoliciesFunc func(*http.Request) []enforce.Policy
	// Cost, if set, says how much a request spends (default 1). A cost
	// below 1 means the request is not counted by this rule. With Settle,
	// it is the estimate reserved before the handler runs.
	Cost func(*http.Request) int
	// FailureMode: enforce.FailOpen or enforce.FailClosed; left zero, the rule fails open.
	FailureMode enforce.FailureMode
	// DryRun rules report (headers, metrics) but never block. A dry-run
	// rule that settles settles too: it counts.
	DryRun bool
	// Settle, if set, makes Cost an estimate that is corrected by the real
	// cost once the response is done: from a response header or trailer,
	// a function of the status and headers, or a refund by status. See
	// Settle; the store must be a tollgate.Settler.
	Settle *Settle
}

// Rejection describes a request the Limiter turns away, for a custom
// response (WithRejectHandler).
type Rejection struct {
	// Status is the status the default response uses: 429 Too Many
	// Requests; 503 Service Unavailable when a fail-closed rule's store
	// failed or a shaped request could not wait its turn; 413 Content Too
	// Large when the request costs more than a policy can ever admit.
	Status int
	// Rule and Policy name what rejected the request.
	Rule, Policy string
	// Result is the policy's decision (zero when the store failed).
	Result tollgate.Result
	// RetryAfter is when to come back; Retry-After is already set to it,
	// in whole seconds rounded up (0 for a 413: never).
	RetryAfter time.Duration
	// Err is the store's error (503), or tollgate.ErrCostExceedsBurst (413).
	Err error
	// Concurrency is the concurrency limit's decision when a Concurrency
	// middleware turned the request away with a 429; its Max is 0 for every
	// other rejection.
	Concurrency tollgate.ConcurrencyResult
}

// Limiter is the middleware: rate-limit rules (New) or a concurrency limit
// (Concurrency). Wrap handlers with Handler. It is safe for concurrent use.
type Limiter struct {
	conc     *concurrency // a concurrency limit; nil for rate-limit rules
	rules    *ruleset.Rules[call]
	reject   func(http.ResponseWriter, *http.Request, Rejection)
	wait     func(context.Context, time.Duration) error
	settlers []*settler // by rule; nil for a rule that does not settle
	hide     []string   // the Settle headers kept from clients
}

// call is what the rules see of a request: the request, and how to find
// its client's address.
type call struct {
	r   *http.Request
	ips *clientip.Resolver
}

// WithRejectHandler writes rejections with f instead of the default
// problem+json body. The rate-limit headers and Retry-After are already set
// when f runs; f writes the status and body.
func WithRejectHandler(f func(http.ResponseWriter, *http.Request, Rejection)) enforce.Option {
	return func(s *settings.Door) { s.Reject = f }
}

// rejecter is the rejection handler opts set, or WriteProblem.
func rejecter(set settings.Door) func(http.ResponseWriter, *http.Request, Rejection) {
	if f, ok := set.Reject.(func(http.ResponseWriter, *http.Request, Rejection)); ok && f != nil {
		return f
	}
	return WriteProblem
}

// New returns a Limiter applying rules against store: at most 256 rules,
// which bounds the series of their metrics. It checks every rule and every
// static policy, and returns the first problem.
func New(store tollgate.Store, rules []Rule, opts ...enforce.Option) (*Limiter, error) {
	set := ruleset.Resolve(opts)
	specs := make([]ruleset.Spec[call], len(rules))
	settlers := make([]*settler, len(rules))
	var hide []string
	for i, cfg := range rules {
		s, err := spec(cfg)
		if err != nil {
			return nil, err
		}
		if cfg.Settle != nil {
			if settlers[i], err = newSettler(cfg.Name, cfg.Settle); err != nil {
				return nil, err
			}
			s.Settles = true
			if st := settlers[i]; st.hide && !slices.Contains(hide, st.header) {
				hide = append(hide, st.header)
			}
		}
		specs[i] = s
	}
	rs, err := ruleset.NewRules("httplimit", "http", store, ClientIP().k, specs, set)
	if err != nil {
		return nil, err
	}
	return &Limiter{rules: rs, reject: rejecter(set), wait: rs.Sleep, settlers: settlers, hide: hide}, nil
}

// spec is cfg in the terms of the shared rule machinery: its matching, and its funcs seeing the
// request.
func spec(cfg Rule) (ruleset.Spec[call], error) {
	s := ruleset.Spec[call]{Name: cfg.Name, Key: cfg.Key.k, Policies: cfg.Policies, FailureMode: cfg.FailureMode, DryRun: cfg.DryRun}
	var pat *pattern
	if cfg.Pattern != "" {
		var err error
		if pat, err = parsePattern(cfg.Pattern); err != nil {
			return s, fmt.Errorf("httplimit: rule %q: %w", cfg.Name, err)
		}
	}
	if match := cfg.Match; pat != nil || match != nil {
		s.Applies = func(c call) bool {
			return (pat == nil || pat.match(c.r)) && (match == nil || match(c.r))
		}
	}
	if f := cfg.PoliciesFunc; f != nil {
		s.PoliciesFunc = func(c call) []enforce.Policy { return f(c.r) }
	}
	if f := cfg.Cost; f != nil {
		s.Cost = func(c call) int { return f(c.r) }
	}
	return s, nil
}

// Handler returns next wrapped by the limiter: each request is checked
// against the rules before next runs. Its signature is the usual middleware
// shape, func(http.Handler) http.Handler.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	if c := l.conc; c != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(w, r, next) })
	}
	if l.rules.Flavor()&^headers.Draft == 0 {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := l.rules.Start()
			f := new(frame)
			l.rules.Served(start, l.serve(w, r, next, &f.rules, f.fields[:], f.text[:]), &f.rules)
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := l.rules.Start()
		f := new(wideFrame)
		l.rules.Served(start, l.serve(w, r, next, &f.rules, f.fields[:], f.text[:]), &f.rules)
	})
}

const maxDecisions = 8 // on the stack; more policies spill to the heap

// frame is what a request needs beyond the stack, in one allocation: the
// rules' room for the store calls' context, which goes to the store, and
// the header fields' slices and the text of their values, which the
// response keeps (Rules.WriteHeaders). With it, an admitted request
// allocates once on memorystore, which is lent its keys (see
// internal/store/lentkeys), and twice on other stores: the frame and the
// store key, which such a store may keep. It
// holds the draft's fields (RateLimit-Policy, RateLimit, Retry-After),
// and text enough for those of a policy or two (RateLimit-Policy's value
// is usually made beforehand, and needs none); longer text is a string of
// its own.
type frame struct {
	rules  ruleset.Scratch
	fields [3]string
	text   [48]byte
}

// wideFrame is frame for a Limiter that writes more flavours than the
// draft's: room for every field.
type wideFrame struct {
	rules  ruleset.Scratch
	fields [9]string
	text   [128]byte
}

// serve decides r, then runs next or writes the rejection, and returns how
// the request left. s, fields and text are the request's frame.
func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler, s *ruleset.Scratch, fields []string, text []byte) ruleset.Served {
	var decs [maxDecisions]headers.Decision
	ctx := r.Context()
	v, ds := l.rules.Decide(ctx, call{r: r, ips: l.rules.ClientIP()}, decs[:0], s)
	l.rules.WriteHeaders(w.Header(), s, fields, text, ds)
	if v.Outcome.Blocks() {
		l.rejectVerdict(w, r, v)
		return ruleset.Denied
	}
	served := ruleset.Admitted
	if v.Delay > 0 {
		if err := l.wait(ctx, v.Delay); err != nil {
			l.rules.Refund(ctx, s) // not served
			l.rejectWith(w, r, Rejection{Status: http.StatusServiceUnavailable, RetryAfter: v.Delay, Err: err})
			return ruleset.Denied
		}
		served = ruleset.Delayed
	}
	if s.Holds() {
		l.serveSettled(w, r, next, s)
		return served
	}
	next.ServeHTTP(w, r)
	return served
}

func (l *Limiter) rejectVerdict(w http.ResponseWriter, r *http.Request, v ruleset.Verdict) {
	rej := Rejection{Rule: v.Rule, Policy: v.Policy, Result: v.Result, Err: v.Err}
	switch {
	case v.Outcome == engine.FailedClosed:
		rej.Status, rej.RetryAfter = http.StatusServiceUnavailable, l.rules.FailClosedRetryAfter()
	case errors.Is(v.Err, tollgate.ErrCostExceedsBurst):
		rej.Status = http.StatusRequestEntityTooLarge
	default:
		rej.Status, rej.RetryAfter = http.StatusTooManyRequests, v.Result.RetryAfter
	}
	l.rejectWith(w, r, rej)
}

func (l *Limiter) rejectWith(w http.ResponseWriter, r *http.Request, rej Rejection) {
	if rej.Status != http.StatusRequestEntityTooLarge {
		headers.SetRetryAfter(w.Header(), rej.RetryAfter)
	}
	l.reject(w, r, rej)
}

// Problem type URIs of the rate-limit draft (section 5), used in 429 and 503
// bodies.
const (
	problemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	problemReducedCap    = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// problem is the RFC 9457 problem details object the default rejection
// writes as application/problem+json.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the policies that rejected the request, the
	// draft's "violated-policies" extension member.
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// RetryAfter repeats Retry-After, in seconds, for clients that read
	// only the body.
	RetryAfter int64 `json:"retry-after,omitempty"`
}

// WriteProblem is the default rejection: an RFC 9457 problem+json body
// naming the violated policy. Use it from a custom handler to fall back.
func WriteProblem(w http.ResponseWriter, _ *http.Request, rej Rejection) {
	p := problem{Status: rej.Status, Title: http.StatusText(rej.Status)}
	if rej.Policy != "" && (rej.Status == http.StatusTooManyRequests || rej.Status == http.StatusRequestEntityTooLarge) {
		p.ViolatedPolicies = []string{rej.Policy} // a failed store violated nothing
	}
	switch {
	case rej.Status == http.StatusTooManyRequests && rej.Concurrency.Max > 0:
		p.Type = problemQuotaExceeded
		p.RetryAfter = headers.RetryAfterSeconds(rej.RetryAfter)
		p.Detail = "Concurrency limit " + strconv.Quote(rej.Policy) + " reached: " + strconv.Itoa(rej.Concurrency.Max) +
			" requests already in flight; retry in at most " + strconv.FormatInt(p.RetryAfter, 10) + " s."
	case rej.Status == http.StatusTooManyRequests:
		p.Type = problemQuotaExceeded
		p.RetryAfter = headers.RetryAfterSeconds(rej.RetryAfter)
		p.Detail = "Rate limit " + strconv.Quote(rej.Policy) + " exceeded; retry in " + strconv.FormatInt(p.RetryAfter, 10) + " s."
	case rej.Status == http.StatusRequestEntityTooLarge:
		p.Type = problemQuotaExceeded
		p.Detail = "This request costs more than rate limit " + strconv.Quote(rej.Policy) + " can ever admit at once."
	case rej.Rule != "": // a fail-closed rule whose store failed
		p.Type = problemReducedCap
		p.RetryAfter = headers.RetryAfterSeconds(rej.RetryAfter)
		p.Detail = "The rate limiter cannot decide right now; retry in " + strconv.FormatInt(p.RetryAfter, 10) + " s."
	default: // a shaped request that could not wait its turn
		p.Type = problemReducedCap
		p.RetryAfter = headers.RetryAfterSeconds(rej.RetryAfter)
		p.Detail = "The request could not wait for its turn."
	}
	body, _ := json.Marshal(p) // strings and ints only: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(rej.Status)
	_, _ = w.Write(append(body, '\n'))
}
