// Package grpclimit is rate limiting for gRPC servers: unary and stream
// server interceptors with the same rules, policies, failure modes, dry-run
// and metrics as httplimit, and the same options (package enforce).
//
//	lim, err := grpclimit.New(store, []grpclimit.Rule{{
//		Name:     "reports",
//		Method:   "/acme.Reports/*",
//		Key:      grpclimit.Metadata("x-api-key"),
//		Policies: []enforce.Policy{{Name: "reports", Limit: tollgate.PerMinute(60)}},
//	}})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
//	)
//
// A denied call fails with RESOURCE_EXHAUSTED and carries a
// google.rpc.RetryInfo detail (when to retry, exact to the microsecond) and
// a google.rpc.QuotaFailure naming the violated policy. A fail-closed rule
// whose store failed answers UNAVAILABLE with a RetryInfo. Every response
// carries the draft RateLimit-Policy and RateLimit fields as header
// metadata ("ratelimit-policy", "ratelimit"), and "retry-after" on a denial.
//
// A stream is checked once, when it opens: limit the number of streams, not
// the messages in them.
//
// A Rule with Settle reserves its Cost as an estimate and corrects it when
// the handler returns, by the real cost the call reports in its trailer
// metadata (the tokens of a completion), a function of the status code and
// trailers, or a refund by status code (the server's own failures): see
// Settle.
//
// Concurrency limits how many calls run at once per key instead, across
// replicas, over a tollgate.ConcurrencyStore: a call or stream holds a slot
// while its handler runs.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/ruleset"
)

// Rule says which calls to limit, by what key, under which limits.
type Rule struct {
	// Name identifies the rule in store keys, metrics and logs. Required.
	Name string
	// Method limits the rule to one full method ("/pkg.Service/Method") or,
	// ending in "/*", to every method of a service ("/pkg.Service/*"); ""
	// matches all.
	Method string
	// Match, if set, must also return true for the rule to apply.
	Match func(ctx context.Context, fullMethod string) bool
	// Key says whom a call is counted against; the zero Key is the peer's
	// address.
	Key Key
	// Policies are the limits, checked in order (see httplimit.Rule).
	Policies []enforce.Policy
	// PoliciesFunc, if set, picks the policies per call instead.
	PoliciesFunc func(ctx context.Context, fullMethod string) []enforce.Policy
	// Cost, if set, says what a call spends (default 1); below 1 it is not
	// counted. With Settle, it is the estimate reserved before the handler
	// runs.
	Cost func(ctx context.Context, fullMethod string) int
	// FailureMode: enforce.FailOpen or enforce.FailClosed; left zero, the rule fails open.
	FailureMode enforce.FailureMode
	// DryRun rules report (metadata, metrics) but never block. A dry-run
	// rule that settles settles too: it counts.
	DryRun bool
	// Settle, if set, makes Cost an estimate that is corrected by the real
	// cost once the call is done: from trailer metadata, a function of the
	// status code and trailers, or a refund by status code. See Settle;
	// the store must be a tollgate.Settler.
	Settle *Settle
}

// Key says whom a rule counts a call against. Store keys are namespaced as
// "<rule>:<kind>:<value>", as in httplimit: a composite's parts each
// prefixed by its length and ':', and a value too long for a store replaced
// by its SHA-256 as "<rule>:<kind>#<hex>", apart from every literal value.
type Key struct{ k ruleset.Key[call] }

// call is what the rules see of a call.
type call struct {
	ctx      context.Context
	method   string
	ips      *clientip.Resolver
	ipHeader string // ips.Header(), lower-cased
}

// Peer keys calls by the client's address: the peer, or behind trusted
// proxies the address in their forwarding metadata (enforce.WithClientIP); IPv6
// grouped by /64. It is the zero Key.
func Peer() Key {
	return Key{ruleset.ValueKey("ip", func(dst []byte, c call) ([]byte, bool) {
		p, ok := peer.FromContext(c.ctx)
		if !ok || p.Addr == nil {
			return dst, false
		}
		md, _ := metadata.FromIncomingContext(c.ctx)
		addr := c.ips.Resolve(p.Addr.String(), md.Get(c.ipHeader))
		if !addr.IsValid() {
			return append(dst, p.Addr.String()...), true
		}
		return c.ips.AppendKey(dst, addr), true
	})}
}

// Metadata keys calls by the first value of metadata key name, such as
// "x-api-key"; a call without it is not counted by the rule.
func Metadata(name string) Key {
	name = strings.ToLower(name)
	if name == "" || strings.ContainsAny(name, ": \t") {
		return Key{ruleset.BadKey[call](fmt.Errorf("metadata key %q is not a metadata name", name))}
	}
	return Key{ruleset.ValueKey("md="+name, func(dst []byte, c call) ([]byte, bool) {
		md, _ := metadata.FromIncomingContext(c.ctx)
		vs := md.Get(name)
		if len(vs) == 0 || vs[0] == "" {
			return dst, false
		}
		return append(dst, vs[0]...), true
	})}
}

// Func keys calls by what f returns (the authenticated user, the tenant);
// kind names it in store keys: 1 to 32 characters without ':', '+', '=',
// spaces or quotes. When f returns false the call is not counted.
func Func(kind string, f func(ctx context.Context, fullMethod string) (string, bool)) Key {
	var fc func(call) (string, bool)
	if f != nil {
		fc = func(c call) (string, bool) { return f(c.ctx, c.method) }
	}
	return Key{ruleset.FuncKey(kind, fc)}
}

// Method keys calls by full method name: each method its own allowance.
func Method() Key {
	return Key{ruleset.ValueKey("method", func(dst []byte, c call) ([]byte, bool) {
		return append(dst, c.method...), true
	})}
}

// Global counts every call the rule matches against one key.
func Global() Key { return Key{ruleset.GlobalKey[call]()} }

// Composite keys calls by all of keys together; a call missing any part is
// not counted.
func Composite(keys ...Key) Key {
	parts := make([]ruleset.Key[call], len(keys))
	for i, k := range keys {
		parts[i] = k.k
	}
	return Key{ruleset.CompositeKey(parts...)}
}

// Limiter makes the interceptors of rate-limit rules (New) or of a
// concurrency limit (Concurrency). Safe for concurrent use.
type Limiter struct {
	conc     *concurrency // a concurrency limit; nil for rate-limit rules
	rules    *ruleset.Rules[call]
	ipHeader string
	wait     func(context.Context, time.Duration) error
	settlers []*settler // by rule; nil for a rule that does not settle
	hide     []string   // the Settle trailers kept from clients
}

// New returns a Limiter applying rules against store: at most 256 rules,
// which bounds the series of their metrics.
func New(store tollgate.Store, rules []Rule, opts ...enforce.Option) (*Limiter, error) {
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
			if st := settlers[i]; st.hide && !slices.Contains(hide, st.trailer) {
				hide = append(hide, st.trailer)
			}
		}
		specs[i] = s
	}
	rs, err := ruleset.NewRules("grpclimit", "grpc", store, Peer().k, specs, ruleset.Resolve(opts))
	if err != nil {
		return nil, err
	}
	return &Limiter{rules: rs, ipHeader: strings.ToLower(rs.ClientIP().Header()), wait: rs.Sleep, settlers: settlers, hide: hide}, nil
}

// spec is cfg in the terms of the shared rule machinery: its method matching, and its funcs
// seeing the call.
func spec(cfg Rule) (ruleset.Spec[call], error) {
	s := ruleset.Spec[call]{Name: cfg.Name, Key: cfg.Key.k, Policies: cfg.Policies, FailureMode: cfg.FailureMode, DryRun: cfg.DryRun}
	applies, err := methodMatcher(cfg.Method, cfg.Match)
	if err != nil {
		return s, fmt.Errorf("grpclimit: rule %q: %w", cfg.Name, err)
	}
	if applies != nil {
		s.Applies = func(c call) bool { return applies(c.ctx, c.method) }
	}
	if f := cfg.PoliciesFunc; f != nil {
		s.PoliciesFunc = func(c call) []enforce.Policy { return f(c.ctx, c.method) }
	}
	if f := cfg.Cost; f != nil {
		s.Cost = func(c call) int { return f(c.ctx, c.method) }
	}
	return s, nil
}

// methodMatcher returns whether a rule with Method m and Match match
// applies to a call, or nil when it applies to all: m is one full method
// ("/pkg.Service/Method") or, ending in "/*", every method of a service.
func methodMatcher(m string, match func(ctx context.Context, fullMethod string) bool) (func(ctx context.Context, fullMethod string) bool, error) {
	if m == "" {
		return match, nil
	}
	if !strings.HasPrefix(m, "/") {
		return nil, fmt.Errorf("method %q must start with /", m)
	}
	method, prefix := strings.TrimSuffix(m, "*"), strings.HasSuffix(m, "/*") // exact, or a service prefix ending in "/"
	return func(ctx context.Context, full string) bool {
		if prefix && !strings.HasPrefix(full, method) || !prefix && full != method {
			return false
		}
		return match == nil || match(ctx, full)
	}, nil
}

// UnaryServerInterceptor checks each unary call before its handler runs
// (a concurrency limit holds it to a slot while its handler runs).
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	if l.conc != nil {
		return l.conc.unary
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := l.rules.Start()
		md, s, served, err := l.check(ctx, info.FullMethod)
		defer l.rules.Served(start, served, s)
		if md.Len() > 0 {
			_ = grpc.SetHeader(ctx, md) // fails only if headers were sent: they were not
		}
		if err != nil {
			return nil, err
		}
		if s == nil || !s.Holds() {
			return handler(ctx, req)
		}
		m, mctx := l.newMeter(ctx, info.FullMethod)
		resp, err := handler(mctx, req)
		l.settle(ctx, s, m, err)
		return resp, err
	}
}

// StreamServerInterceptor checks each stream once, when it opens (a
// concurrency limit holds it to a slot until its handler returns).
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	if l.conc != nil {
		return l.conc.stream
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		md, s, _, err := l.check(ctx, info.FullMethod) // a stream's life is not a latency: not timed
		if md.Len() > 0 {
			_ = ss.SetHeader(md)
		}
		if err != nil {
			return err
		}
		if s == nil || !s.Holds() {
			return handler(srv, ss)
		}
		m, mctx := l.newMeter(ctx, info.FullMethod)
		err = handler(srv, &meteredStream{ServerStream: ss, ctx: mctx, m: m})
		l.settle(ctx, s, m, err)
		return err
	}
}

// check decides a call and returns the rate-limit header metadata, how the
// call leaves the interceptor and, when it must not proceed, its status
// error. When rules settle, s holds the call's reservations; when Served
// times calls by arm, the arms.
func (l *Limiter) check(ctx context.Context, method string) (md metadata.MD, s *ruleset.Scratch, served ruleset.Served, err error) {
	if l.rules.Settles() || l.rules.Times() {
		s = new(ruleset.Scratch)
	}
	v, ds := l.rules.Decide(ctx, call{ctx: ctx, method: method, ips: l.rules.ClientIP(), ipHeader: l.ipHeader}, nil, s)
	md = l.metadata(ds)
	if v.Outcome.Blocks() {
		return md, s, ruleset.Denied, l.denial(v)
	}
	if v.Delay > 0 {
		if err := l.wait(ctx, v.Delay); err != nil {
			l.rules.Refund(ctx, s) // not served
			return md, s, ruleset.Denied, status.FromContextError(err).Err()
		}
		return md, s, ruleset.Delayed, nil
	}
	return md, s, ruleset.Admitted, nil
}

// metadata renders the decisions as header metadata: the chosen flavours
// and retry-after, with lower-case keys.
func (l *Limiter) metadata(ds []headers.Decision) metadata.MD {
	if len(ds) == 0 {
		return nil
	}
	h := http.Header{}
	headers.Write(h, l.rules.Flavor(), l.rules.Now(), ds...)
	md := make(metadata.MD, len(h))
	for k, vs := range h {
		md[strings.ToLower(k)] = vs
	}
	return md
}

func (l *Limiter) denial(v ruleset.Verdict) error {
	var st *status.Status
	var details []protoadapt.MessageV1
	switch {
	case v.Outcome == engine.FailedClosed:
		st = status.New(codes.Unavailable, "grpclimit: rate limiter unavailable (rule "+strconv.Quote(v.Rule)+" fails closed)")
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(l.rules.FailClosedRetryAfter())})
	case errors.Is(v.Err, tollgate.ErrCostExceedsBurst):
		st = status.New(codes.ResourceExhausted, "grpclimit: call costs more than policy "+strconv.Quote(v.Policy)+" can ever admit")
		details = append(details, quotaFailure(v, "call costs more than the policy can ever admit"))
	default:
		st = status.New(codes.ResourceExhausted, "grpclimit: rate limit "+strconv.Quote(v.Policy)+" exceeded; retry in "+v.Result.RetryAfter.String())
		details = append(details,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(v.Result.RetryAfter)},
			quotaFailure(v, "rate limit exceeded: "+v.Result.Limit.String()))
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

func quotaFailure(v ruleset.Verdict, desc string) *errdetails.QuotaFailure {
	return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     "rule:" + v.Rule + " policy:" + v.Policy,
		Description: desc,
	}}}
}
