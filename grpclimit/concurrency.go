package grpclimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/ruleset"
)

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
	// renewed (zero: 30 s); tollgate.MinLease to tollgate.MaxLease.
	// A call still running at half its lease renews it, in the background,
	// every half lease until it ends. The lease is also how long a slot of
	// a crashed process stays taken.
	Lease time.Duration
	// FailureMode says what happens when the store fails or misses its
	// deadline: FailOpen runs the call without a slot, FailClosed fails it
	// with UNAVAILABLE and a RetryInfo; left zero, the rule fails open.
	FailureMode enforce.FailureMode
}

// concurrency is one ConcurrencyRule, ready to serve.
type concurrency struct {
	slots   *ruleset.Slots
	applies func(ctx context.Context, fullMethod string) bool // nil: all calls
	key     func(ctx context.Context, fullMethod string) (string, bool)
}

// Concurrency returns a Limiter holding the calls rule matches
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
func Concurrency(store tollgate.ConcurrencyStore, rule ConcurrencyRule, opts ...enforce.Option) (*Limiter, error) {
	slots, err := ruleset.NewSlots("grpclimit", store, rule.Name, rule.Max, rule.Lease, rule.FailureMode, ruleset.Resolve(opts))
	if err != nil {
		return nil, err
	}
	if rule.Key == nil {
		return nil, fmt.Errorf("grpclimit: concurrency rule %q: no Key", rule.Name)
	}
	applies, err := methodMatcher(rule.Method, rule.Match)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: concurrency rule %q: %w", rule.Name, err)
	}
	return &Limiter{conc: &concurrency{slots: slots, applies: applies, key: rule.Key}}, nil
}

// unary holds each unary call to the limit while its handler runs.
func (c *concurrency) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	h, err := c.acquire(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if h != nil {
		defer h.End()
	}
	return handler(ctx, req)
}

// stream holds each stream to the limit from when it opens until its
// handler returns.
func (c *concurrency) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	h, err := c.acquire(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	if h != nil {
		defer h.End()
	}
	return handler(srv, ss)
}

// acquire takes a slot for a call and returns its holding (nil when the
// call runs without a slot: the rule does not apply, or failed open), or
// the status error the call fails with.
func (c *concurrency) acquire(ctx context.Context, method string) (*ruleset.Holding, error) {
	if c.applies != nil && !c.applies(ctx, method) {
		return nil, nil
	}
	value, ok := c.key(ctx, method)
	if !ok {
		return nil, nil
	}
	h, res, outcome, _ := c.slots.Take(ctx, value)
	name := c.slots.Name()
	switch outcome {
	case engine.FailedClosed:
		st := status.New(codes.Unavailable, "grpclimit: concurrency limiter unavailable (rule "+strconv.Quote(name)+" fails closed)")
		return nil, withDetails(st, &errdetails.RetryInfo{RetryDelay: durationpb.New(c.slots.FailClosedRetryAfter())})
	case engine.FailedOpen:
		return nil, nil
	case engine.Denied:
		st := status.New(codes.ResourceExhausted, "grpclimit: concurrency limit "+strconv.Quote(name)+" reached; retry in "+res.RetryAfter.String()+" at the latest")
		return nil, withDetails(st,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)},
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
				Subject:     "rule:" + name,
				Description: "concurrency limit reached: " + strconv.Itoa(res.Max) + " in flight",
			}}})
	}
	return h, nil
}

// withDetails returns st with details as its error.
func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil {
		st = d
	}
	return st.Err()
}
