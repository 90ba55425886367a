package service

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/storekey"
	"github.com/tollgate/tollgate/internal/service/config"
)

// Server decides rate-limit requests against its rules and store. It is
// safe for concurrent use; its rules can be swapped at any time (SetRules,
// Reload) without disturbing requests in flight.
type Server struct {
	pb.UnimplementedRateLimitServiceServer

	store    tollgate.Store
	timeout  time.Duration
	failMode enforce.FailureMode
	dryRun   bool
	log      *slog.Logger
	reg      *prometheus.Registry
	m        *metrics
	ping     func(context.Context) error
	now      func() time.Time
	health   *health.Server
	flavor   headers.Flavor
	// envoy's deployment surface (see envoy.go)
	envoy          *envoyStats
	nearLimitRatio float64
	compat         bool
	quotaMode      bool
	metadata       bool
	headerNames    map[string]string           // header field → name it is sent as
	loadOpts       []config.Option             // how Reload loads rules
	parallel       bool                        // a request's store calls at once
	wire           [len(headerOrder)]wireField // response_headers_to_add: fields and names

	// bounds on one request (see limits.go)
	maxDescriptors, maxEntries, maxHits, maxBytes int

	snap     atomic.Pointer[snapshot]
	reloadMu sync.Mutex // one load at a time
	storeUp  atomic.Bool
	draining atomic.Bool
	logEvery time.Duration
	// engine spends each descriptor's limit: the step every door shares.
	engine *engine.Engine
	// conc holds the slots of concurrency rules (WithConcurrencyStore).
	conc tollgate.ConcurrencyStore
}

// snapshot is the rules in force and what the server keeps per rule.
type snapshot struct {
	rules *config.Rules
	per   []ruleState // by Rule.Index
}

type ruleState struct {
	rule  *config.Rule
	point engine.Point                    // the rule as the engine sees it
	envoy envoyCounters                   // envoy's statistics of the rule
	limit *pb.RateLimitResponse_RateLimit // shared by every response: read-only
	// counters are made on first use, so that /metrics shows only the
	// outcomes a rule has had.
	counters [numOutcomes]atomic.Pointer[prometheus.Counter]
}

func (st *ruleState) counter(m *metrics, o engine.Outcome) prometheus.Counter {
	if c := st.counters[o].Load(); c != nil {
		return *c
	}
	c := m.decisions.WithLabelValues(st.rule.Domain, st.rule.ID, decisionLabels[o])
	st.counters[o].Store(&c)
	return c
}

// Option configures a Server.
type Option func(*Server)

// WithTimeout sets the deadline of each request's store calls together
// (default enforce.DefaultTimeout, 50 ms, as for the middleware). When it passes, each rule's failure mode decides.
// Requests starting within a millisecond of each other share one timer, so
// a request may get up to a millisecond more. A caller's own deadline that
// comes sooner (Envoy's filter sends 20 ms by default) bounds the store
// calls instead, less a reserve for the answer's way back (a quarter of the
// time the caller has left, at most 10 ms), so that a slow store is
// answered by failure mode while the caller still waits. 0 sets no
// deadline at all, for a store that never waits (memorystore).
func WithTimeout(d time.Duration) Option { return func(s *Server) { s.timeout = d } }

// WithFailureMode sets what rules without their own failure_mode answer
// when the store fails: enforce.FailOpen (the default) or
// enforce.FailClosed (config.FailureMode is the same type).
func WithFailureMode(m enforce.FailureMode) Option { return func(s *Server) { s.failMode = m } }

// WithDryRun makes the whole service a dry run, as envoyproxy/ratelimit's
// global SHADOW_MODE does: every decision is made and counted, but the
// overall answer is always OK, so that limits can be watched before they
// are enforced.
func WithDryRun(on bool) Option { return func(s *Server) { s.dryRun = on } }

// WithLogInterval logs store failures at most once per d (default
// enforce.DefaultLogInterval, 10 s, as for the middleware); each record
// says how many were left out since the previous one, in its
// similar_events_not_logged attribute. 0 logs every failure.
func WithLogInterval(d time.Duration) Option { return func(s *Server) { s.logEvery = d } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithRegistry sets the Prometheus registry the server registers its
// metrics on and serves at /metrics. By default it makes its own, with the
// Go runtime and process collectors.
func WithRegistry(r *prometheus.Registry) Option { return func(s *Server) { s.reg = r } }

// WithPing sets how the server checks that its store answers (for
// /readyz): for Redis, a PING. Without it the store is taken to be always
// reachable, which is right for memorystore.
func WithPing(ping func(context.Context) error) Option { return func(s *Server) { s.ping = ping } }

// WithHeaders selects the rate-limit header fields put in
// response_headers_to_add (and on /json and the auth endpoint's
// responses): by default headers.Draft, the IETF RateLimit-Policy and
// RateLimit fields; 0 adds none. Retry-After comes with every flavour when
// the request is over the limit.
func WithHeaders(f headers.Flavor) Option { return func(s *Server) { s.flavor = f } }

// WithLoadOptions sets how Reload loads rules (config.WithMergeDomains,
// config.WithRuntimeTree, config.WithLimits, …): pass the options the
// first load used, or a reload would read the files differently.
func WithLoadOptions(opts ...config.Option) Option {
	return func(s *Server) { s.loadOpts = append(s.loadOpts, opts...) }
}

// WithParallelDescriptors makes the store calls of a request's
// descriptors at once rather than one after another, so that a request of
// several descriptors waits for one round trip to a remote store (with
// redisstore.WithPipeline, they go in one pipeline). Each descriptor still
// spends on its own. It costs a goroutine per descriptor: for Redis, not
// for memorystore, whose calls never wait.
func WithParallelDescriptors(on bool) Option { return func(s *Server) { s.parallel = on } }

// WithClock sets the server's clock (default time.Now); tests use it.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// New returns a Server deciding against store. It has no rules until
// SetRules or Reload; until then every descriptor is answered OK and
// /readyz says not ready.
func New(store tollgate.Store, opts ...Option) (*Server, error) {
	s := &Server{store: store, timeout: enforce.DefaultTimeout, failMode: enforce.FailOpen, now: time.Now, health: health.NewServer(), flavor: headers.Draft,
		nearLimitRatio: DefaultNearLimitRatio,
		maxDescriptors: DefaultMaxDescriptors, maxEntries: DefaultMaxEntries, maxHits: DefaultMaxHits, maxBytes: DefaultMaxRequestBytes}
	s.logEvery = enforce.DefaultLogInterval
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.failMode == enforce.FailDefault {
		s.failMode = enforce.FailOpen
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
		s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if err := s.checkEnvoyOptions(); err != nil {
		return nil, err
	}
	s.wire = s.wireFields()
	m, err := newMetrics(s.reg)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.envoy = newEnvoyStats()
	for _, c := range s.envoy.collectors() {
		if err := s.reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: register metrics: %w", err)
		}
	}
	s.engine = engine.NewEngine(store, s.timeout, s.log, s.logEvery, s.now)
	s.storeUp.Store(s.ping == nil)
	s.updateReady()
	return s, nil
}

// Registry returns the registry the server's metrics are on.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Rules returns the rules in force, or nil.
func (s *Server) Rules() *config.Rules {
	if sn := s.snap.Load(); sn != nil {
		return sn.rules
	}
	return nil
}

// SetRules swaps rules in: requests already in flight finish with the
// rules they started with.
func (s *Server) SetRules(rules *config.Rules) {
	all := rules.All()
	sn := &snapshot{rules: rules, per: make([]ruleState, len(all))}
	for i, r := range all {
		st := &sn.per[i]
		st.rule = r
		st.point = s.point(r)
		switch {
		case r.Concurrency != nil:
			// No unit: requests_per_unit is how many may be in flight.
			st.limit = &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: uint32(r.Concurrency.Max)}
		case !r.Unlimited:
			st.limit = &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(r.Unit)}
		}
	}
	s.snap.Store(sn)
	s.m.rules.Set(float64(len(all)))
	s.m.lastReload.Set(float64(s.now().UnixNano()) / 1e9)
	s.updateReady()
}

// Reload loads the rules at path (a file or a directory) and swaps them in.
// When they do not load — a syntax error, an unknown key, an invalid value
// — the rules in force stay, the failure is logged with every problem
// found and counted, and the error is returned. Rules identical to those in
// force are not swapped. Reload is what SIGHUP and a file change call.
func (s *Server) Reload(path string) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	rules, err := config.Load(path, s.loadOpts...)
	if err != nil {
		s.m.reloads[reloadFailure].Inc()
		s.log.Error("rules not loaded; the previous rules stay in force", "path", path, "error", err.Error())
		return err
	}
	if rules.Same(s.Rules()) {
		s.m.reloads[reloadUnchanged].Inc()
		return nil
	}
	s.SetRules(rules)
	s.m.reloads[reloadSuccess].Inc()
	s.log.Info("rules loaded", "path", path, "files", len(rules.Files()), "domains", rules.Domains(), "rules", len(rules.All()))
	return nil
}

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	resp, _, err := s.decideFor(ctx, apiGRPC, req, true)
	return resp, err
}

// headerOrder is the order of the fields in response_headers_to_add, and
// wireName how they are spelled there (Envoy sends them as given).
var (
	headerOrder = [...]string{headers.PolicyField, headers.LimitField, headers.OldLimitField, headers.OldRemainingField,
		headers.OldResetField, headers.XLimitField, headers.XRemainingField, headers.XResetField, headers.RetryAfterField}
	wireName = map[string]string{
		headers.PolicyField: "RateLimit-Policy", headers.LimitField: "RateLimit",
		headers.OldLimitField: "RateLimit-Limit", headers.OldRemainingField: "RateLimit-Remaining", headers.OldResetField: "RateLimit-Reset",
		headers.XLimitField: "X-RateLimit-Limit", headers.XRemainingField: "X-RateLimit-Remaining", headers.XResetField: "X-RateLimit-Reset",
		headers.RetryAfterField: "Retry-After",
	}
)

// wireField is one field of response_headers_to_add: its key in the
// server's header map and the name it is sent as.
type wireField struct{ key, wire string }

// wireFields is headerOrder as the server sends it, its renamed fields
// (WithHeaderNames) included: worked out once, in New.
func (s *Server) wireFields() [len(headerOrder)]wireField {
	var fs [len(headerOrder)]wireField
	for i, name := range headerOrder {
		fs[i].key, fs[i].wire = s.headerName(name)
	}
	return fs
}

// invalid counts and returns the error of an invalid request:
// InvalidArgument, as envoyproxy/ratelimit refuses a request without a
// domain or descriptors. An invalid request is the caller's mistake: it
// is answered at once, never by a failure mode, and never counted or
// logged as a store failure.
func (s *Server) invalid(via api, reason invalidReason, msg string) error {
	s.countInvalid(via, reason)
	return status.Error(codes.InvalidArgument, "server: "+msg)
}

// countInvalid counts an invalid request that came via for reason.
func (s *Server) countInvalid(via api, reason invalidReason) {
	s.m.requests[via][codeInvalid].Inc()
	s.m.invalid[reason].Inc()
}

// item is one descriptor of a request on its way to an answer.
type item struct {
	rule    *config.Rule
	state   *ruleState // nil for an override limit
	dropped bool       // replaced by another rule of the request
	phase   phase      // which call of the request (PhaseKey)
	permit  string     // the request's name for a concurrency slot (PermitKey)
}

// decide answers one request. It is the heart of every API. Besides the
// response it returns the rate-limit header fields of the answer (nil when
// there are none): every descriptor the store decided, as a policy named
// after its rule.
func (s *Server) decide(ctx context.Context, via api, req *pb.RateLimitRequest) (*pb.RateLimitResponse, http.Header, error) {
	return s.decideFor(ctx, via, req, false)
}

// decideFor is decide for either kind of caller: with inResponse, the
// header fields go into the response's response_headers_to_add (gRPC)
// and no header is returned; without, they are returned.
//
// Its steps: check the request, match each descriptor to a rule (match),
// answer each descriptor (answerAll), and add the answers up into the
// overall code and header fields (sumUp).
//
// It is the service's hot path, written to allocate little: a request's
// items, answers and header decisions live on the stack up to a few
// descriptors, and a response to one descriptor (the usual request) is
// made in one allocation (newParts). The stack is kept small on the way to
// the store too, where it is deepest: gRPC runs a request on a fresh
// goroutine whenever its stream workers are busy, and every kilobyte more
// there is a stack to grow and copy.
func (s *Server) decideFor(ctx context.Context, via api, req *pb.RateLimitRequest, inResponse bool) (*pb.RateLimitResponse, http.Header, error) {
	if err := s.check(via, req); err != nil {
		return nil, nil, err
	}
	req, marks, err := s.stripMarks(via, req)
	if err != nil {
		return nil, nil, err
	}
	sn := s.snap.Load()
	var stack [4]item
	items := stack[:0]
	if n := len(req.GetDescriptors()); n > len(stack) {
		items = make([]item, 0, n)
	}
	items = s.match(sn, req, items)
	for i, m := range marks {
		items[i].phase, items[i].permit = m.phase, m.permit
	}
	if err := s.checkItems(via, req, items); err != nil {
		return nil, nil, err
	}
	return s.answerAll(ctx, via, req, items, inResponse)
}

// answerAll answers the descriptors of req, matched to items, and adds
// the answers up (sumUp). With WithParallelDescriptors, when two
// descriptors or more need the store, their store calls are made at once.
func (s *Server) answerAll(ctx context.Context, via api, req *pb.RateLimitRequest, items []item, inResponse bool) (*pb.RateLimitResponse, http.Header, error) {
	n := len(items)
	p := newParts(n)
	var astack [4]answered
	answers := astack[:0]
	if n > len(astack) {
		answers = make([]answered, 0, n)
	}
	answers = answers[:n]
	if s.parallel && storeCalls(items) >= 2 {
		// The goroutines need the items and answers on the heap; only
		// here, so that the other requests keep them on the stack.
		hi, ha := append([]item(nil), items...), make([]answered, n)
		s.answerTogether(ctx, req, hi, p.statuses, p.resets, ha)
		copy(answers, ha)
	} else {
		s.answerInTurn(ctx, req, items, &p, answers)
	}
	return s.sumUp(ctx, via, req, items, answers, &p, inResponse)
}

// sumUp counts the answers of req's descriptors and adds them up into the
// response's overall code and the header fields.
func (s *Server) sumUp(ctx context.Context, via api, req *pb.RateLimitRequest, items []item, answers []answered, p *parts, inResponse bool) (*pb.RateLimitResponse, http.Header, error) {
	var hstack [4]headers.Decision
	t := tally{overall: pb.RateLimitResponse_OK, hds: hstack[:0]}
	for i, d := range req.GetDescriptors() {
		a, it := &answers[i], &items[i]
		if !a.decided {
			continue
		}
		s.count(it, d.GetEntries(), a.o)
		s.countHits(s.statsFor(it, d.GetEntries()), it.rule, a.o, cost(hitsOf(req, d), it.rule.Cost), a.res)
		t.add(it.rule, &p.statuses[i], s.quotaMode)
		// Header fields describe a rate: not a concurrency rule's slots,
		// nor a charge, whose answer Envoy ignores.
		if s.flavor != 0 && it.rule.Concurrency == nil && (a.o == engine.Allowed || a.o == engine.Denied || a.o == engine.DryRunDenied) {
			t.hds = append(t.hds, headerDecision(it.rule, a.o, a.res))
		}
	}
	resp := p.resp
	resp.OverallCode = s.overall(via, &t)
	traceDecision(ctx, req, resp.OverallCode)
	if s.metadata {
		resp.DynamicMetadata = requestMetadata(req)
	}
	if inResponse {
		s.addHeaders(p, t.hds, resp.OverallCode)
		return resp, nil, nil
	}
	return resp, s.header(t.hds, resp.OverallCode), nil
}

// answered is what answer returned for one descriptor.
type answered struct {
	o       engine.Outcome
	res     tollgate.Result
	decided bool
}

// parts are the pieces of one response, made together (newParts) and
// filled in place: the response, its statuses (resp.Statuses points at
// them), a duration_until_reset per status, and room for
// response_headers_to_add.
type parts struct {
	resp     *pb.RateLimitResponse
	statuses []pb.RateLimitResponse_DescriptorStatus
	resets   []durationpb.Duration
	hdrs     []core.HeaderValue  // length 0, and the capacity there is room for
	hdrPtrs  []*core.HeaderValue // the same
	room     *engine.Room        // for the store calls' context; nil: the engine makes one
}

// oneReply is the memory of the response to one descriptor, in one
// allocation: with the draft's two header fields and a Retry-After, seven
// allocations fewer than made one by one. gRPC encodes a response and lets
// it go, so keeping its pieces together keeps nothing alive for longer.
type oneReply struct {
	resp    pb.RateLimitResponse
	ptr     [1]*pb.RateLimitResponse_DescriptorStatus
	status  [1]pb.RateLimitResponse_DescriptorStatus
	reset   [1]durationpb.Duration
	hdrs    [3]core.HeaderValue
	hdrPtrs [3]*core.HeaderValue
	room    engine.Room
}

// newParts returns the pieces of a response to n descriptors.
func newParts(n int) parts {
	if n == 1 {
		r := &oneReply{}
		r.ptr[0] = &r.status[0]
		r.resp.Statuses = r.ptr[:]
		return parts{resp: &r.resp, statuses: r.status[:], resets: r.reset[:], hdrs: r.hdrs[:0], hdrPtrs: r.hdrPtrs[:0], room: &r.room}
	}
	p := parts{
		resp:     &pb.RateLimitResponse{Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, n)},
		statuses: make([]pb.RateLimitResponse_DescriptorStatus, n),
		resets:   make([]durationpb.Duration, n),
	}
	for i := range p.statuses {
		p.resp.Statuses[i] = &p.statuses[i]
	}
	return p
}

// answerInTurn answers every descriptor of req, one after another, into
// p's statuses and answers.
func (s *Server) answerInTurn(ctx context.Context, req *pb.RateLimitRequest, items []item, p *parts, answers []answered) {
	q := s.engine.BeginIn(ctx, p.room)
	defer q.End()
	for i, d := range req.GetDescriptors() {
		a := &answers[i]
		a.o, a.res, a.decided = s.answer(&q, req, d, &items[i], &p.statuses[i], &p.resets[i])
	}
}

// answerTogether answers every descriptor of req into statuses (and
// resets, their durations until reset) and answers, making their store calls at once (WithParallelDescriptors), so
// that a request costs one round trip (one pipeline) rather than one per
// descriptor; each still spends on its own, as in envoyproxy/ratelimit.
// decideFor calls it only when two descriptors or more need the store:
// it costs a goroutine for each but the first.
func (s *Server) answerTogether(ctx context.Context, req *pb.RateLimitRequest, items []item, statuses []pb.RateLimitResponse_DescriptorStatus, resets []durationpb.Duration, answers []answered) {
	q := s.engine.Begin(ctx)
	defer q.End()
	q.Context() // armed before the goroutines share it
	descs := req.GetDescriptors()
	one := func(i int) {
		a := &answers[i]
		a.o, a.res, a.decided = s.answer(&q, req, descs[i], &items[i], &statuses[i], &resets[i])
	}
	var wg sync.WaitGroup
	for i := 1; i < len(descs); i++ {
		wg.Go(func() { one(i) })
	}
	one(0)
	wg.Wait()
}

// storeCalls is how many of items may need a store call.
func storeCalls(items []item) int {
	n := 0
	for i := range items {
		if r := items[i].rule; r != nil && !items[i].dropped && !r.Unlimited && !r.DenyAll() {
			n++
		}
	}
	return n
}

// match finds the rule of each descriptor of req in the snapshot sn (nil
// when no rules are loaded) and appends one item per descriptor to items.
// Rules replaced by another rule of the request are marked dropped.
func (s *Server) match(sn *snapshot, req *pb.RateLimitRequest, items []item) []item {
	var rules *config.Rules
	if sn != nil {
		rules = sn.rules
	}
	known := rules != nil && rules.HasDomain(req.Domain)
	replaced := false
	for _, d := range req.GetDescriptors() {
		var it item
		switch {
		case !known:
			s.m.noRule[0].Inc()
		case d.GetLimit() != nil:
			l := d.GetLimit()
			it.rule = config.OverrideRule(req.Domain, config.Unit(l.GetUnit()), l.GetRequestsPerUnit(), l.GetUnitMultiplier().GetValue())
		default:
			it.rule = config.Lookup(rules, req.Domain, d.GetEntries())
			if it.rule == nil {
				s.m.noRule[1].Inc()
			} else {
				it.state = &sn.per[it.rule.Index]
				replaced = replaced || len(it.rule.Replaces) > 0
			}
		}
		items = append(items, it)
	}
	if replaced {
		dropReplaced(items)
	}
	return items
}

// answer decides one descriptor d of req, matched to it, and fills its
// status st, using reset for its duration_until_reset. It reports decided false for a descriptor that no rule
// limits (no rule, a replaced rule, an unlimited rule), which is answered
// OK and already counted; the rest are to be counted and added up by the
// caller.
func (s *Server) answer(q *engine.Request, req *pb.RateLimitRequest, d *rlv3.RateLimitDescriptor, it *item, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration) (o engine.Outcome, res tollgate.Result, decided bool) {
	r := it.rule
	if r == nil || it.dropped {
		st.Code = pb.RateLimitResponse_OK
		return 0, res, false
	}
	if r.Unlimited {
		st.Code = pb.RateLimitResponse_OK
		st.LimitRemaining = math.MaxUint32
		s.count(it, d.GetEntries(), engine.Unlimited)
		return 0, res, false
	}
	if it.state != nil {
		st.CurrentLimit = it.state.limit
	} else {
		st.CurrentLimit = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: r.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(r.Unit)}
	}
	hits := hitsOf(req, d)
	switch {
	case r.Concurrency != nil:
		o, res = s.concurrent(q, req.Domain, d.GetEntries(), it, hits, st, reset)
	case r.DenyAll():
		o, res = s.denyAll(r, hits, st, reset)
	case it.phase == phaseStreamDone:
		o, res = s.charge(q, req.Domain, d.GetEntries(), it, hits, st, reset)
	default:
		o, res = s.spend(q, req.Domain, d.GetEntries(), it, hits, st, reset)
	}
	if o == engine.Denied && r.DryRun {
		o = engine.DryRunDenied
	}
	if o == engine.Denied || o == engine.FailedClosed {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
	} else {
		st.Code = pb.RateLimitResponse_OK
	}
	return o, res, true
}

// denyAll answers a rule of 0 requests per unit without a store call: over
// the limit for any hits, until the end of the current period.
func (s *Server) denyAll(r *config.Rule, hits int, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration) (engine.Outcome, tollgate.Result) {
	o := engine.Denied
	if hits == 0 {
		o = engine.Allowed
	}
	res := tollgate.Result{Limit: r.Limit}
	period := int64(r.Unit.Duration())
	res.RetryAfter = time.Duration(period - s.now().UnixNano()%period)
	st.DurationUntilReset = roundUp(res.RetryAfter, reset)
	return o, res
}

// tally adds up the answers of a request's descriptors.
type tally struct {
	overall          pb.RateLimitResponse_Code // from the rules that are not quota rules
	quota, quotaOver int                       // quota rules, and those of them over the limit
	hds              []headers.Decision        // header fields, one per decided descriptor
}

// add counts the answer st of a descriptor of rule r.
func (t *tally) add(r *config.Rule, st *pb.RateLimitResponse_DescriptorStatus, quotaMode bool) {
	if r.QuotaMode || quotaMode {
		t.quota++
		if st.Code == pb.RateLimitResponse_OVER_LIMIT {
			t.quotaOver++
		}
	} else if st.Code == pb.RateLimitResponse_OVER_LIMIT {
		t.overall = pb.RateLimitResponse_OVER_LIMIT
	}
}

// overall is the request's overall code from t, after the quota rules and
// global dry run have had their say; it counts the request, which came via.
func (s *Server) overall(via api, t *tally) pb.RateLimitResponse_Code {
	overall := t.overall
	// Quota rules deny together: only when every one of them is over.
	if t.quota > 0 && t.quota == t.quotaOver {
		overall = pb.RateLimitResponse_OVER_LIMIT
	}
	if overall == pb.RateLimitResponse_OVER_LIMIT && s.dryRun {
		overall = pb.RateLimitResponse_OK
		s.m.globalDryRun.Inc()
	}
	if overall == pb.RateLimitResponse_OVER_LIMIT {
		s.m.requests[via][codeOverLimit].Inc()
	} else {
		s.m.requests[via][codeOK].Inc()
	}
	return overall
}

// headerDecision is the header fields' view of outcome o of rule r: a
// policy named after the rule.
func headerDecision(r *config.Rule, o engine.Outcome, res tollgate.Result) headers.Decision {
	res.Allowed = o == engine.Allowed
	policy := r.Name
	if policy == "" {
		policy = r.ID
	}
	return headers.Decision{Policy: policy, Result: res, DryRun: r.DryRun}
}

// header writes the header fields of hds in the server's flavor, or
// returns nil when there are none.
func (s *Server) header(hds []headers.Decision, overall pb.RateLimitResponse_Code) http.Header {
	if len(hds) == 0 {
		return nil
	}
	h := make(http.Header, 3)
	s.writeHeader(h, nil, hds, overall)
	return h
}

// writeHeader writes the header fields of hds (at least one) into h,
// their slices in vals when it is not nil (headers.Values.Write).
func (s *Server) writeHeader(h http.Header, vals *headers.Values, hds []headers.Decision, overall pb.RateLimitResponse_Code) {
	if overall == pb.RateLimitResponse_OK {
		// The global dry run or quota_mode let the request through:
		// no Retry-After for a request that passes.
		for i := range hds {
			hds[i].Result.Allowed = true
		}
	}
	// The clock is read only for X-RateLimit-Reset, the one field that
	// is a moment rather than a duration.
	var now time.Time
	if s.flavor&headers.XRateLimit != 0 {
		now = s.now()
	}
	if vals != nil {
		vals.Write(h, s.flavor, now, hds...)
	} else {
		headers.Write(h, s.flavor, now, hds...)
	}
	if s.compat {
		h.Del(headers.RetryAfterField) // envoy's answers carry none
	}
	for field, name := range s.headerNames {
		if v, ok := h[field]; ok {
			delete(h, field)
			h[http.CanonicalHeaderKey(name)] = v
		}
	}
}

// scratch is what addHeaders writes the header fields into and empties
// again: a map, and room for its slices. The fields' values (strings)
// outlive both, which are only a way to them.
type scratch struct {
	h    http.Header
	vals headers.Values
}

// scratchHeaders holds addHeaders' scratch between responses.
var scratchHeaders = sync.Pool{New: func() any { return &scratch{h: make(http.Header, len(headerOrder))} }}

// addHeaders writes the header fields of hds into p's response as
// response_headers_to_add, in headerOrder, making them in p's room where
// there is enough.
func (s *Server) addHeaders(p *parts, hds []headers.Decision, overall pb.RateLimitResponse_Code) {
	if len(hds) == 0 {
		return
	}
	sc := scratchHeaders.Get().(*scratch)
	h := sc.h
	s.writeHeader(h, &sc.vals, hds, overall)
	n := len(h)
	if n > cap(p.hdrs) {
		p.hdrs, p.hdrPtrs = make([]core.HeaderValue, 0, n), make([]*core.HeaderValue, 0, n)
	}
	for i := 0; i < len(s.wire) && len(p.hdrs) < n; i++ { // the draft's fields come first: two lookups
		if v := h[s.wire[i].key]; len(v) > 0 {
			p.hdrs = append(p.hdrs, core.HeaderValue{Key: s.wire[i].wire, Value: v[0]})
			p.hdrPtrs = append(p.hdrPtrs, &p.hdrs[len(p.hdrs)-1])
		}
	}
	clear(h)
	sc.vals = headers.Values{}
	scratchHeaders.Put(sc)
	if len(p.hdrPtrs) > 0 {
		p.resp.ResponseHeadersToAdd = p.hdrPtrs
	}
}

// spend spends hits of the rule of it through the engine and fills st
// (and reset, its duration_until_reset) from its result.
func (s *Server) spend(q *engine.Request, domain string, entries []*rlv3.RateLimitDescriptor_Entry, it *item, hits int, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration) (engine.Outcome, tollgate.Result) {
	r := it.rule
	var p *engine.Point
	if it.state != nil {
		p = &it.state.point
	} else {
		p = s.overridePoint(r)
	}
	key := counterKey(domain, entries, r)
	step := q.Spend(p, "", key, r.Limit, cost(hits, r.Cost))
	res := step.Result
	switch step.Outcome {
	case engine.FailedOpen:
		traceStoreFailure(q.Context(), engine.FailedOpen, step.Err)
		return engine.FailedOpen, res
	case engine.FailedClosed:
		traceStoreFailure(q.Context(), engine.FailedClosed, step.Err)
		return engine.FailedClosed, res
	case engine.Allowed:
		st.LimitRemaining = remaining(res)
		if res.ResetAfter > 0 {
			st.DurationUntilReset = roundUp(res.ResetAfter, reset)
		}
		return engine.Allowed, res
	}
	if step.Err == nil { // not a cost above what the rule can ever admit
		st.LimitRemaining = remaining(res)
		st.DurationUntilReset = roundUp(res.RetryAfter, reset)
		if s.compat {
			s.spendDenied(q, p, key, r, res)
			st.LimitRemaining = 0
		}
	}
	return engine.Denied, res
}

func remaining(res tollgate.Result) uint32 {
	return uint32(min(max(int64(res.Remaining), 0), math.MaxUint32))
}

// point is rule r as the engine sees it: its failure mode (the server's
// when r has none), dry run, and the server's store metrics.
func (s *Server) point(r *config.Rule) engine.Point {
	mode := r.FailureMode
	if mode == enforce.FailDefault {
		mode = s.failMode
	}
	return engine.Point{Rule: r.ID, Mode: mode, DryRun: r.DryRun,
		Latency: s.m.storeDuration, Errors: s.m.storeErrors[1], Timeouts: s.m.storeErrors[0], Skipped: s.m.storeSkipped}
}

// overridePoint is s.point(r) for a descriptor's own limit, which has no
// rule state to keep it in. It is made on the heap, not in spend's frame:
// spend is on the way to the store, where the stack is deepest, and
// override limits are rare.
//
//go:noinline
func (s *Server) overridePoint(r *config.Rule) *engine.Point {
	p := s.point(r)
	return &p
}

func (s *Server) count(it *item, entries []*rlv3.RateLimitDescriptor_Entry, o engine.Outcome) {
	r := it.rule
	if it.state != nil && !r.HasValueToMetric() {
		it.state.counter(s.m, o).Inc()
		return
	}
	// detailed_metric, value_to_metric and override limits: the name
	// depends on the request (as in envoyproxy/ratelimit, mind the
	// cardinality).
	s.m.decisions.WithLabelValues(r.Domain, config.MetricID(r, entries), decisionLabels[o]).Inc()
}

// dropReplaced drops the rules named in the replaces of any rule of the
// request (whether that rule is itself dropped or not, as in
// envoyproxy/ratelimit).
func dropReplaced(items []item) {
	for i := range items {
		ri := items[i].rule
		if ri == nil || ri.Name == "" {
			continue
		}
		for j := range items {
			if rj := items[j].rule; rj != nil && contains(rj.Replaces, ri.Name) {
				items[i].dropped = true
				break
			}
		}
	}
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// hitsOf returns how many hits descriptor d adds: its own hits_addend when
// set (0 looks without spending), else the request's, where 0 means 1.
// A refund (is_negative_hits) is not supported: it only looks.
func hitsOf(req *pb.RateLimitRequest, d *rlv3.RateLimitDescriptor) int {
	if d.GetIsNegativeHits() {
		return 0
	}
	if h := d.GetHitsAddend(); h != nil {
		return int(min(h.GetValue(), math.MaxInt32))
	}
	return int(max(req.GetHitsAddend(), 1))
}

// roundUp returns d rounded up to whole seconds, as envoyproxy/ratelimit
// reports duration_until_reset: a proxy that prints it in seconds never
// sends a client back early. It is written into into, which it returns,
// or nil when d is not positive.
func roundUp(d time.Duration, into *durationpb.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	into.Seconds = int64((d + time.Second - 1) / time.Second)
	return into
}

// counterKey is the store key of a descriptor's counter:
// "rl|domain|key=value|key=value", with '|', '=' and '\' escaped by '\' so
// that no two descriptors share a key, and with a share_threshold pattern
// instead of the value where the rule has one. A key longer than the store
// accepts becomes "rl#" and the SHA-256 of what follows "rl|"
// (storekey.String, as the middleware hashes): every literal key starts
// with "rl|", so no descriptor can spell the hashed key of another.
func counterKey(domain string, entries []*rlv3.RateLimitDescriptor_Entry, r *config.Rule) string {
	var stack [256]byte
	b := append(stack[:0], "rl|"...)
	b = appendEscaped(b, domain)
	for i, e := range entries {
		b = append(b, '|')
		b = appendEscaped(b, e.GetKey())
		b = append(b, '=')
		v := e.GetValue()
		if sv, ok := r.SharedValue(i); ok {
			v = sv
		}
		b = appendEscaped(b, v)
	}
	return storekey.String(b, len("rl|"))
}

func appendEscaped(b []byte, s string) []byte {
	i := 0
	for i < len(s) && s[i] != '|' && s[i] != '=' && s[i] != '\\' {
		i++
	}
	b = append(b, s[:i]...) // all of s, for most values
	for ; i < len(s); i++ {
		switch c := s[i]; c {
		case '|', '=', '\\':
			b = append(b, '\\', c)
		default:
			b = append(b, c)
		}
	}
	return b
}

// Probe checks the store every interval (with WithPing) until ctx ends,
// and keeps readiness and the tollgate_serve_store_up metric up to date.
// Store state changes are logged.
func (s *Server) Probe(ctx context.Context, interval time.Duration) {
	if s.ping == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, max(interval/2, s.timeout))
		err := s.ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		up := err == nil
		if was := s.storeUp.Swap(up); was != up {
			if up {
				s.log.Info("store reachable")
			} else {
				s.log.Error("store unreachable; answering by failure mode", "error", err.Error())
			}
		}
		s.updateReady()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Drain marks the server as shutting down: /healthcheck and /readyz fail
// and the gRPC health service says NOT_SERVING, so that load balancers
// stop sending, while requests keep being answered until the listeners
// close.
func (s *Server) Drain() {
	s.draining.Store(true)
	s.updateReady()
	s.health.Shutdown()
}

// Ready reports whether the server should get traffic, and if not, why.
func (s *Server) Ready() (bool, string) {
	switch {
	case s.draining.Load():
		return false, "shutting down"
	case s.snap.Load() == nil:
		return false, "no rules loaded"
	case !s.storeUp.Load():
		return false, "store unreachable"
	}
	return true, "ready"
}

func (s *Server) updateReady() {
	ok, _ := s.Ready()
	v, st := 0.0, healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		v, st = 1, healthpb.HealthCheckResponse_SERVING
	}
	s.m.ready.Set(v)
	up := 0.0
	if s.storeUp.Load() {
		up = 1
	}
	s.m.storeUp.Set(up)
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(pb.RateLimitService_ServiceDesc.ServiceName, st)
	s.health.SetServingStatus("ratelimit", st) // the name envoyproxy/ratelimit registers
}
