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

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/health"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// Server decides rate-limit requests against its rules and store. It is
// safe for concurrent use; its rules can be swapped at any time (SetRules,
// Reload) without disturbing requests in flight.
type Server struct {
	pb.UnimplementedRateLimitServiceServer

	// What decides: the store, through the engine, under the rules in
	// force.
	store    tollgate.Store
	conc     tollgate.ConcurrencyStore // the slots of concurrency rules (WithConcurrencyStore)
	engine   *engine.Engine            // spends each descriptor's limit: the step every door shares
	snap     atomic.Pointer[snapshot]  // the rules in force, swapped whole (rules.go)
	reloadMu sync.Mutex                // one load at a time
	loadOpts []config.Option           // how Reload loads rules

	// How it decides and answers: set by the options, read-only once New
	// returns.
	failMode enforce.FailureMode // of rules without their own
	dryRun   bool                // the global dry run: every overall answer is OK
	parallel bool                // a request's store calls at once
	max      bounds              // on one request (limits.go)
	envoy    envoyWays           // envoyproxy/ratelimit's (envoy.go)
	hdr      headerStyle         // the rate-limit header fields (headers.go)
	timeout  time.Duration       // the engine's deadline
	logEvery time.Duration       // the engine's failure-log interval

	// What it reports.
	log   *slog.Logger
	now   func() time.Time
	reg   *prometheus.Registry
	m     *metrics
	stats *envoyStats // envoyproxy/ratelimit's statistics (envoystats.go)

	// Whether it should get traffic (health.go).
	health   *health.Server
	ping     func(context.Context) error
	storeUp  atomic.Bool
	draining atomic.Bool
}

// New returns a Server deciding against store. It has no rules until
// SetRules or Reload; until then every descriptor is answered OK and
// /readyz says not ready.
func New(store tollgate.Store, opts ...Option) (*Server, error) {
	s := &Server{
		store:    store,
		failMode: enforce.FailOpen,
		max:      bounds{descriptors: DefaultMaxDescriptors, entries: DefaultMaxEntries, hits: DefaultMaxHits, bytes: DefaultMaxRequestBytes},
		envoy:    envoyWays{nearLimitRatio: DefaultNearLimitRatio},
		hdr:      headerStyle{flavor: headers.Draft},
		timeout:  enforce.DefaultTimeout,
		logEvery: enforce.DefaultLogInterval,
		now:      time.Now,
		health:   health.NewServer(),
	}
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
	s.hdr.wire = s.wireFields()
	m, err := newMetrics(s.reg)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.stats = newEnvoyStats()
	for _, c := range s.stats.collectors() {
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

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	resp, _, err := s.decideFor(ctx, apiGRPC, req, true)
	return resp, err
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
		t.add(it.rule, &p.statuses[i], s.envoy.quotaMode)
		// Header fields describe a rate: not a concurrency rule's slots,
		// nor a charge, whose answer Envoy ignores.
		if s.hdr.flavor != 0 && it.rule.Concurrency == nil && (a.o == engine.Allowed || a.o == engine.Denied || a.o == engine.DryRunDenied) {
			t.hds = append(t.hds, headerDecision(it.rule, a.o, a.res))
		}
	}
	resp := p.resp
	resp.OverallCode = s.overall(via, &t)
	traceDecision(ctx, req, resp.OverallCode)
	if s.envoy.metadata {
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
