// Package grpclimit is rate limiting for gRPC servers: unary and stream
// server interceptors with the same rules, policies, failure modes, dry-run
// and metrics as httplimit (both are built on package enforce).
//
//	lim, err := grpclimit.New(store, []grpclimit.Rule{{
//		Name:     "reports",
//		Method:   "/acme.Reports/*",
//		Key:      grpclimit.Metadata("x-api-key"),
//		Policies: []grpclimit.Policy{{Name: "reports", Limit: tollgate.PerMinute(60)}},
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
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
)

// Policy is a named limit (see enforce.Policy).
type Policy = enforce.Policy

// FailureMode says what a rule does when the store fails (see
// enforce.FailureMode).
type FailureMode = enforce.FailureMode

// The failure modes.
const (
	FailOpen   = enforce.FailOpen
	FailClosed = enforce.FailClosed
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
	Policies []Policy
	// PoliciesFunc, if set, picks the policies per call instead.
	PoliciesFunc func(ctx context.Context, fullMethod string) []Policy
	// Cost, if set, says what a call spends (default 1); below 1 it is not
	// counted.
	Cost func(ctx context.Context, fullMethod string) int
	// FailureMode: FailOpen or FailClosed; left zero, the rule fails open.
	FailureMode FailureMode
	// DryRun rules report (metadata, metrics) but never block.
	DryRun bool
}

type keyKind uint8

const (
	kindPeer keyKind = iota
	kindMetadata
	kindFunc
	kindMethod
	kindGlobal
	kindComposite
)

// Key says whom a rule counts a call against. Store keys are namespaced as
// "<rule>:<kind>:<value>", as in httplimit: a composite's parts each
// prefixed by its length and ':', and a value too long for a store replaced
// by its SHA-256 as "<rule>:<kind>#<hex>", apart from every literal value.
type Key struct {
	kind  keyKind
	name  string
	fn    func(ctx context.Context, fullMethod string) (string, bool)
	parts []Key
}

// Peer keys calls by the client's address: the peer, or behind trusted
// proxies the address in their forwarding metadata (WithClientIP); IPv6
// grouped by /64. It is the zero Key.
func Peer() Key { return Key{} }

// Metadata keys calls by the first value of metadata key name, such as
// "x-api-key"; a call without it is not counted by the rule.
func Metadata(name string) Key { return Key{kind: kindMetadata, name: strings.ToLower(name)} }

// Func keys calls by what f returns (the authenticated user, the tenant);
// kind names it in store keys. When f returns false the call is not counted.
func Func(kind string, f func(ctx context.Context, fullMethod string) (string, bool)) Key {
	return Key{kind: kindFunc, name: kind, fn: f}
}

// Method keys calls by full method name: each method its own allowance.
func Method() Key { return Key{kind: kindMethod} }

// Global counts every call the rule matches against one key.
func Global() Key { return Key{kind: kindGlobal} }

// Composite keys calls by all of keys together.
func Composite(keys ...Key) Key { return Key{kind: kindComposite, parts: keys} }

func (k *Key) kindName() string {
	switch k.kind {
	case kindPeer:
		return "ip"
	case kindMetadata:
		return "md=" + k.name
	case kindFunc:
		return k.name
	case kindMethod:
		return "method"
	case kindGlobal:
		return "all"
	}
	names := make([]string, len(k.parts))
	for i := range k.parts {
		names[i] = k.parts[i].kindName()
	}
	return strings.Join(names, "+")
}

func (k *Key) check() error {
	switch k.kind {
	case kindMetadata:
		if k.name == "" || strings.ContainsAny(k.name, ": \t") {
			return fmt.Errorf("grpclimit: metadata key %q is not a metadata name", k.name)
		}
	case kindFunc:
		if k.fn == nil || k.name == "" || len(k.name) > 32 || strings.ContainsAny(k.name, ":+= \t\"") {
			return fmt.Errorf("grpclimit: key kind %q: want a function and a name of 1 to 32 characters without ':', '+', '=', spaces or quotes", k.name)
		}
	case kindComposite:
		if len(k.parts) < 2 {
			return errors.New("grpclimit: a composite key needs at least two parts")
		}
		for i := range k.parts {
			if k.parts[i].kind == kindComposite {
				return errors.New("grpclimit: composite keys do not nest")
			}
			if err := k.parts[i].check(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *Limiter) appendValue(dst []byte, k *Key, ctx context.Context, method string) ([]byte, bool) {
	switch k.kind {
	case kindPeer:
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return dst, false
		}
		addr := clientip.ParsePeer(p.Addr.String())
		if !addr.IsValid() {
			return append(dst, p.Addr.String()...), true
		}
		md, _ := metadata.FromIncomingContext(ctx)
		addr = l.ips.Resolve(addr, md.Get(l.ipHeader))
		return l.ips.AppendKey(dst, addr), true
	case kindMetadata:
		md, _ := metadata.FromIncomingContext(ctx)
		vs := md.Get(k.name)
		if len(vs) == 0 || vs[0] == "" {
			return dst, false
		}
		return append(dst, vs[0]...), true
	case kindFunc:
		v, ok := k.fn(ctx, method)
		return append(dst, v...), ok
	case kindMethod:
		return append(dst, method...), true
	case kindGlobal:
		return dst, true
	}
	// Composite: each part's value prefixed by its length and ':', as in
	// httplimit, so that no two different tuples spell the same key.
	for i := range k.parts {
		start := len(dst)
		var ok bool
		if dst, ok = l.appendValue(dst, &k.parts[i], ctx, method); !ok {
			return dst, false
		}
		dst = enforce.AppendPart(dst, start)
	}
	return dst, true
}

type rule struct {
	method       string // exact, or a service prefix ending in "/"
	prefix       bool
	match        func(context.Context, string) bool
	key          Key
	keyPrefix    string
	policies     []Policy
	policiesFunc func(context.Context, string) []Policy
	cost         func(context.Context, string) int
	r            *enforce.Rule
}

func (rl *rule) applies(ctx context.Context, method string) bool {
	if rl.method != "" {
		if rl.prefix && !strings.HasPrefix(method, rl.method) || !rl.prefix && method != rl.method {
			return false
		}
	}
	return rl.match == nil || rl.match(ctx, method)
}

// Limiter holds the rules and makes the interceptors. Safe for concurrent
// use.
type Limiter struct {
	rules          []rule
	ips            *clientip.Resolver
	ipHeader       string
	flavor         headers.Flavor
	failRetryAfter time.Duration
	wait           func(context.Context, time.Duration) error

	engineOpts []enforce.Option
	registry   prometheus.Registerer
	metrics    *enforce.Metrics
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithTimeout bounds each rule's store calls (default 50 ms); 0 removes
// the deadline.
func WithTimeout(d time.Duration) Option {
	return func(l *Limiter) { l.engineOpts = append(l.engineOpts, enforce.WithTimeout(d)) }
}

// WithClientIP finds client addresses with r: behind trusted proxies, from
// the metadata key named by r.Header(), lower-cased ("x-forwarded-for").
func WithClientIP(r *clientip.Resolver) Option { return func(l *Limiter) { l.ips = r } }

// WithHeaders selects the header flavours sent as response metadata
// (default headers.Draft).
func WithHeaders(f headers.Flavor) Option { return func(l *Limiter) { l.flavor = f } }

// WithRegistry registers the metrics (tollgate_grpc_decisions_total,
// tollgate_grpc_store_duration_seconds, tollgate_grpc_store_errors_total)
// on reg.
func WithRegistry(reg prometheus.Registerer) Option { return func(l *Limiter) { l.registry = reg } }

// WithMetrics records into m, shared with other Limiters.
func WithMetrics(m *enforce.Metrics) Option { return func(l *Limiter) { l.metrics = m } }

// WithLogger logs store failures to lg (default slog.Default()).
func WithLogger(lg *slog.Logger) Option {
	return func(l *Limiter) { l.engineOpts = append(l.engineOpts, enforce.WithLogger(lg)) }
}

// WithLogInterval logs store failures at most once per d (default 10 s).
func WithLogInterval(d time.Duration) Option {
	return func(l *Limiter) { l.engineOpts = append(l.engineOpts, enforce.WithLogInterval(d)) }
}

// WithFailClosedRetryAfter sets the RetryInfo delay of a fail-closed
// UNAVAILABLE (default 1 s).
func WithFailClosedRetryAfter(d time.Duration) Option {
	return func(l *Limiter) { l.failRetryAfter = d }
}

// New returns a Limiter applying rules against store.
func New(store tollgate.Store, rules []Rule, opts ...Option) (*Limiter, error) {
	l := &Limiter{ips: &clientip.Resolver{}, flavor: headers.Draft, failRetryAfter: time.Second, wait: sleep}
	for _, o := range opts {
		o(l)
	}
	if store == nil {
		return nil, errors.New("grpclimit: nil store")
	}
	l.ipHeader = strings.ToLower(l.ips.Header())
	if l.metrics == nil && l.registry != nil {
		m, err := enforce.NewMetrics(l.registry, "grpc")
		if err != nil {
			return nil, fmt.Errorf("grpclimit: %w", err)
		}
		l.metrics = m
	}
	if l.metrics != nil {
		l.engineOpts = append(l.engineOpts, enforce.WithMetrics(l.metrics))
	}
	engine := enforce.New(store, l.engineOpts...)
	seen := map[string]bool{}
	for _, cfg := range rules {
		r, err := engine.Rule(cfg.Name, cfg.FailureMode, cfg.DryRun)
		if err != nil {
			return nil, fmt.Errorf("grpclimit: %w", err)
		}
		if seen[cfg.Name] {
			return nil, fmt.Errorf("grpclimit: two rules named %q", cfg.Name)
		}
		seen[cfg.Name] = true
		rl := rule{match: cfg.Match, key: cfg.Key, policies: cfg.Policies, policiesFunc: cfg.PoliciesFunc, cost: cfg.Cost, r: r}
		if m := cfg.Method; m != "" {
			if !strings.HasPrefix(m, "/") {
				return nil, fmt.Errorf("grpclimit: rule %q: method %q must start with /", cfg.Name, m)
			}
			rl.method, rl.prefix = strings.TrimSuffix(m, "*"), strings.HasSuffix(m, "/*")
		}
		if err := rl.key.check(); err != nil {
			return nil, fmt.Errorf("grpclimit: rule %q: %w", cfg.Name, err)
		}
		rl.keyPrefix = cfg.Name + ":" + rl.key.kindName() + ":"
		if cfg.PoliciesFunc == nil {
			if err := enforce.CheckPolicies(cfg.Policies); err != nil {
				return nil, fmt.Errorf("grpclimit: rule %q: %w", cfg.Name, err)
			}
		} else if len(cfg.Policies) > 0 {
			return nil, fmt.Errorf("grpclimit: rule %q: set Policies or PoliciesFunc, not both", cfg.Name)
		}
		l.rules = append(l.rules, rl)
	}
	return l, nil
}

// UnaryServerInterceptor checks each unary call before its handler runs.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := l.check(ctx, info.FullMethod)
		if md.Len() > 0 {
			_ = grpc.SetHeader(ctx, md) // fails only if headers were sent: they were not
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor checks each stream once, when it opens.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := l.check(ss.Context(), info.FullMethod)
		if md.Len() > 0 {
			_ = ss.SetHeader(md)
		}
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// check decides a call and returns the rate-limit header metadata and, when
// the call must not proceed, its status error.
func (l *Limiter) check(ctx context.Context, method string) (metadata.MD, error) {
	var (
		ds     []headers.Decision
		keyBuf [160]byte
		delay  time.Duration
	)
	for i := range l.rules {
		rl := &l.rules[i]
		if !rl.applies(ctx, method) {
			continue
		}
		policies := rl.policies
		if rl.policiesFunc != nil {
			if policies = rl.policiesFunc(ctx, method); len(policies) == 0 {
				continue
			}
		}
		cost := 1
		if rl.cost != nil {
			if cost = rl.cost(ctx, method); cost < 1 {
				continue
			}
		}
		b := append(keyBuf[:0], rl.keyPrefix...)
		b, ok := l.appendValue(b, &rl.key, ctx, method)
		if !ok {
			continue
		}
		var v enforce.Verdict
		v, ds = rl.r.Decide(ctx, enforce.KeyString(b, len(rl.keyPrefix)), policies, cost, ds)
		if v.Outcome.Blocks() {
			return l.metadata(ds), l.denial(rl, v)
		}
		delay = max(delay, v.Delay)
	}
	md := l.metadata(ds)
	if delay > 0 {
		if err := l.wait(ctx, delay); err != nil {
			return md, status.FromContextError(err).Err()
		}
	}
	return md, nil
}

// metadata renders the decisions as header metadata: the chosen flavours
// and retry-after, with lower-case keys.
func (l *Limiter) metadata(ds []headers.Decision) metadata.MD {
	if len(ds) == 0 {
		return nil
	}
	h := http.Header{}
	headers.Write(h, l.flavor, time.Now(), ds...)
	md := make(metadata.MD, len(h))
	for k, vs := range h {
		md[strings.ToLower(k)] = vs
	}
	return md
}

func (l *Limiter) denial(rl *rule, v enforce.Verdict) error {
	var st *status.Status
	var details []protoadapt.MessageV1
	switch {
	case v.Outcome == enforce.FailedClosed:
		st = status.New(codes.Unavailable, "grpclimit: rate limiter unavailable (rule "+strconv.Quote(rl.r.Name())+" fails closed)")
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(l.failRetryAfter)})
	case errors.Is(v.Err, tollgate.ErrCostExceedsBurst):
		st = status.New(codes.ResourceExhausted, "grpclimit: call costs more than policy "+strconv.Quote(v.Policy)+" can ever admit")
		details = append(details, quotaFailure(rl, v, "call costs more than the policy can ever admit"))
	default:
		st = status.New(codes.ResourceExhausted, "grpclimit: rate limit "+strconv.Quote(v.Policy)+" exceeded; retry in "+v.Result.RetryAfter.String())
		details = append(details,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(v.Result.RetryAfter)},
			quotaFailure(rl, v, "rate limit exceeded: "+v.Result.Limit.String()))
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

func quotaFailure(rl *rule, v enforce.Verdict, desc string) *errdetails.QuotaFailure {
	return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     "rule:" + rl.r.Name() + " policy:" + v.Policy,
		Description: desc,
	}}}
}

func sleep(ctx context.Context, d time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return context.DeadlineExceeded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
