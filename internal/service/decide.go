package service

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/rollout"
	"github.com/tollgate/tollgate/internal/service/config"
)

// The descriptor path: how one request, whichever API it came through, is
// answered. decide lists the stages in order; each stage is one function
// below it, in the same order. What a rule of each kind does with a
// descriptor's hits is in spend.go (rate rules) and concurrency.go
// (concurrency rules).

// decide answers one request that came via an API. For gRPC (inResponse)
// the rate-limit header fields go into the response's
// response_headers_to_add and no header is returned; for the HTTP APIs
// they are returned, nil when there are none, to be sent as the HTTP
// response's own. A request refused as invalid is an InvalidArgument
// error.
//
// It is the service's hot path, written to allocate little: a request's
// items and answers live on the stack up to a few descriptors, and a
// response to one descriptor (the usual request) is made in one allocation
// (newParts). The stack is kept small on the way to the store too, where
// it is deepest: gRPC runs a request on a fresh goroutine whenever its
// stream workers are busy, and every kilobyte more there is a stack to
// grow and copy. So what only the later stages need (the header fields'
// decisions) lives in their own frames, made once the store has answered.
func (s *Server) decide(ctx context.Context, via api, req *pb.RateLimitRequest, inResponse bool) (*pb.RateLimitResponse, http.Header, error) {
	if err := s.check(via, req); err != nil {
		return nil, nil, err
	}
	if s.snap.Load() == nil {
		if s.sink != nil && (via == apiGRPC || via == apiJSON) {
			s.sink.CallFailed(false) // envoy's service_error, as for an invalid request
		}
		return nil, nil, errNoRules
	}
	req, marks, err := s.stripMarks(via, req)
	if err != nil {
		return nil, nil, err
	}
	n := len(req.GetDescriptors())
	var itemStack [4]item
	items := fit(itemStack[:], n)
	s.match(via, req, marks, items)
	dropReplaced(items)
	if err := s.checkMatched(via, items); err != nil {
		return nil, nil, err
	}
	p := newParts(n)
	var answerStack [4]answered
	answers := fit(answerStack[:], n)
	if s.parallel && storeCalls(items) >= 2 {
		s.answerTogether(ctx, req, items, &p, answers)
	} else {
		s.answerInTurn(ctx, req, items, &p, answers)
	}
	s.count(req, items, answers)
	s.countStoreFailed(answers)
	resp := p.resp
	resp.OverallCode = s.overall(via, items, answers)
	traceDecision(ctx, req, resp.OverallCode)
	if s.envoy.metadata {
		resp.DynamicMetadata = requestMetadata(req, passedMetadata(items, resp.Statuses))
	}
	return resp, s.headerFields(&p, items, answers, inResponse), nil
}

// errNoRules answers every request before the first rules are in force
// (only rules over xDS can be late), in envoyproxy/ratelimit's words and
// gRPC code, so that Envoy's filter treats it as envoy's: a failure of the
// service, answered by its failure_mode_deny.
var errNoRules = status.Error(codes.Unknown, "no rate limit configuration loaded")

// item is one descriptor of a request on its way to an answer.
type item struct {
	rule    *config.Rule
	state   *ruleState // nil for an override limit
	dropped bool       // replaced by another rule of the request
	phase   phase      // which call of the request (PhaseKey)
	permit  string     // the request's name for a concurrency slot (PermitKey)
	// rollout says the rule has a rollout, which put the descriptor in arm
	// (rollout.go).
	rollout bool
	arm     rollout.Arm
}

// answered is one descriptor's answer: what became of it and the store's
// result.
type answered struct {
	o   engine.Outcome
	res tollgate.Result
	// decided says that a limit decided the descriptor: it is counted, it
	// has its say in the overall code and the header fields describe it.
	// A descriptor without a rule, or of a replaced rule, is none of
	// these; one of an unlimited rule is only counted (o Unlimited).
	decided bool
	// set is each limit's step, for a rule of several limits (set.go),
	// and at the index of the limit that decided, whose result res is;
	// nil for any other rule.
	set []engine.Step
	at  int
}

// fit returns stack[:n] when stack holds n, else n new: a request of a few
// descriptors keeps what it has per descriptor in its caller's frame.
func fit[T any](stack []T, n int) []T {
	if n <= len(stack) {
		return stack[:n]
	}
	return make([]T, n)
}

// check refuses a request past the bounds before any rule is looked up.
func (s *Server) check(via api, req *pb.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return s.invalid(via, invalidRequest, "rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return s.invalid(via, invalidRequest, "rate limit descriptor list must not be empty")
	}
	if len(descs) > s.max.descriptors {
		return s.invalid(via, invalidDescriptors, fmt.Sprintf("%d descriptors: at most %d are allowed", len(descs), s.max.descriptors))
	}
	if h := req.GetHitsAddend(); uint64(h) > uint64(s.max.hits) {
		return s.invalid(via, invalidHits, fmt.Sprintf("hits_addend %d: at most %d is allowed", h, s.max.hits))
	}
	for i, d := range descs {
		if n := len(d.GetEntries()); n > s.max.entries {
			return s.invalid(via, invalidEntries, fmt.Sprintf("descriptor %d has %d entries: at most %d are allowed", i, n, s.max.entries))
		}
		// A stream-done charge spends at most its rule's capacity (see
		// charge), whatever its hits: its cost to the store is bounded
		// without refusing a response that reports many tokens.
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > uint64(s.max.hits) && !streamDone(d.GetEntries()) {
			return s.invalid(via, invalidHits, fmt.Sprintf("descriptor %d: hits_addend %d: at most %d is allowed", i, h.GetValue(), s.max.hits))
		}
	}
	return nil
}

// stripMarks returns req with the PhaseKey and PermitKey entries taken out
// of its descriptors, so that both calls of a request meet the same rule
// and counter, and what they said, one mark per descriptor. A request
// without them (nearly every one) is returned as it is, with nil marks and
// no allocation. A phase it does not know is an invalid request.
func (s *Server) stripMarks(via api, req *pb.RateLimitRequest) (*pb.RateLimitRequest, []mark, error) {
	descs := req.GetDescriptors()
	first := slices.IndexFunc(descs, func(d *rlv3.RateLimitDescriptor) bool { return hasReserved(d.GetEntries()) })
	if first < 0 {
		return req, nil, nil
	}
	out := &pb.RateLimitRequest{Domain: req.GetDomain(), HitsAddend: req.GetHitsAddend(),
		Descriptors: make([]*rlv3.RateLimitDescriptor, len(descs))}
	copy(out.Descriptors, descs[:first])
	marks := make([]mark, len(descs))
	for i := first; i < len(descs); i++ {
		d := descs[i]
		if !hasReserved(d.GetEntries()) {
			out.Descriptors[i] = d
			continue
		}
		kept := make([]*rlv3.RateLimitDescriptor_Entry, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			switch e.GetKey() {
			case PhaseKey:
				switch e.GetValue() {
				case PhaseRequest:
					marks[i].phase = phaseRequest
				case PhaseStreamDone:
					marks[i].phase = phaseStreamDone
				default:
					return nil, nil, s.invalid(via, invalidPhase, fmt.Sprintf("descriptor %d: %s %q: want %s or %s", i, PhaseKey, e.GetValue(), PhaseRequest, PhaseStreamDone))
				}
			case PermitKey:
				marks[i].permit = e.GetValue()
			default:
				kept = append(kept, e)
			}
		}
		out.Descriptors[i] = &rlv3.RateLimitDescriptor{Entries: kept, Limit: d.GetLimit(), HitsAddend: d.GetHitsAddend(), IsNegativeHits: d.GetIsNegativeHits()}
	}
	return out, marks, nil
}

// match finds the rule of each descriptor of req, which came via, among
// the rules in force and fills items, one per descriptor, with it and with
// what the descriptor's marks said (marks nil: nothing). A descriptor of an
// unknown domain, or that no rule matches, has no rule: it is counted in
// tollgate_serve_no_rule_total and logged, sampled (unmatched.go). A
// descriptor carrying its own limit has that limit for a rule, in a known
// domain.
func (s *Server) match(via api, req *pb.RateLimitRequest, marks []mark, items []item) {
	sn := s.snap.Load()
	var rules *config.Rules
	if sn != nil {
		rules = sn.rules
	}
	known := rules != nil && rules.HasDomain(req.Domain)
	for i, d := range req.GetDescriptors() {
		it := &items[i]
		if marks != nil {
			it.phase, it.permit = marks[i].phase, marks[i].permit
		}
		switch {
		case !known:
			s.m.noRule[noRuleDomain].Inc()
			if s.sink != nil {
				s.sink.DomainNotFound(req.Domain)
			}
			s.logUnmatched(via, noRuleDomain, req.Domain, d.GetEntries(), rules)
		case d.GetLimit() != nil:
			l := d.GetLimit()
			it.rule = config.OverrideRule(req.Domain, config.Unit(l.GetUnit()), l.GetRequestsPerUnit(), l.GetUnitMultiplier().GetValue())
		default:
			it.rule = config.Lookup(rules, req.Domain, d.GetEntries())
			if it.rule == nil {
				s.m.noRule[noRuleMatch].Inc()
				s.logUnmatched(via, noRuleMatch, req.Domain, d.GetEntries(), rules)
			} else {
				it.state = &sn.per[it.rule.Index]
			}
		}
	}
}

// dropReplaced drops the rules named in the replaces of any rule of the
// request, whether that rule is itself dropped or not, as in
// envoyproxy/ratelimit; a name of one limit of a set drops the whole set.
// Most rules replace none, and then it only looks.
func dropReplaced(items []item) {
	for j := range items {
		rj := items[j].rule
		if rj == nil || len(rj.Replaces) == 0 {
			continue
		}
		for i := range items {
			if ri := items[i].rule; ri != nil && slices.ContainsFunc(rj.Replaces, ri.Named) {
				items[i].dropped = true
			}
		}
	}
}

// checkMatched refuses a request one of whose matched descriptors cannot
// be answered: a stream-done call of a concurrency rule that names no
// permit, or a descriptor carrying a limit of its own that is not a valid
// limit (no unit, an unknown one, a period longer than a store counts; 0
// requests per unit denies, as a rule's does). That is the caller's
// mistake, not a decision. A cost above what a rule can ever admit is not
// refused here: it is over the limit (see spend), as envoyproxy/ratelimit
// answers it, so that a gateway failing open on errors does not let it
// through.
func (s *Server) checkMatched(via api, items []item) error {
	for i := range items {
		it := &items[i]
		r := it.rule
		if r == nil || it.dropped {
			continue
		}
		if r.Concurrency != nil && it.phase == phaseStreamDone && it.permit == "" {
			return s.invalid(via, invalidPhase, fmt.Sprintf("descriptor %d: a stream-done call of a concurrency rule must name the request's permit (%s)", i, PermitKey))
		}
		if it.state == nil { // a descriptor's own limit
			if r.Unlimited {
				return s.invalid(via, invalidOverride, fmt.Sprintf("descriptor %d: its limit has no unit", i))
			}
			if err := r.Limit.Validate(); err != nil && !r.DenyAll() {
				return s.invalid(via, invalidOverride, fmt.Sprintf("descriptor %d: its limit: %v", i, err))
			}
		}
	}
	return nil
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

// answerInTurn answers every descriptor of req, one after another, into
// p's statuses and into answers.
func (s *Server) answerInTurn(ctx context.Context, req *pb.RateLimitRequest, items []item, p *parts, answers []answered) {
	q := s.engine.BeginIn(ctx, p.room)
	defer q.End()
	for i, d := range req.GetDescriptors() {
		s.answer(&q, req, d, &items[i], &p.statuses[i], &p.resets[i], &answers[i])
	}
}

// answerTogether is answerInTurn with the store calls made at once
// (WithParallelDescriptors), so that a request costs one round trip (one
// pipeline) rather than one per descriptor; each descriptor still spends
// on its own, as in envoyproxy/ratelimit. decide calls it only when two
// descriptors or more need the store: it costs a goroutine for each but
// the first, and copies of the items and answers on the heap for the
// goroutines to share, so that the other requests keep theirs on the
// stack.
func (s *Server) answerTogether(ctx context.Context, req *pb.RateLimitRequest, items []item, p *parts, answers []answered) {
	shared, got := append([]item(nil), items...), make([]answered, len(items))
	statuses, resets := p.statuses, p.resets
	q := s.engine.Begin(ctx)
	defer q.End()
	q.Context() // armed before the goroutines share it
	descs := req.GetDescriptors()
	one := func(i int) {
		s.answer(&q, req, descs[i], &shared[i], &statuses[i], &resets[i], &got[i])
	}
	var wg sync.WaitGroup
	for i := 1; i < len(descs); i++ {
		wg.Go(func() { one(i) })
	}
	one(0)
	wg.Wait()
	copy(answers, got)
	copy(items, shared) // a rollout's arm (chooseArm)
}

// answer decides descriptor d of req by the rule it matched (it): it fills
// its status st, with reset for its duration_until_reset, and a, zero
// until then. A descriptor that no limit decides — no rule, a replaced
// rule, an unlimited rule — is answered OK without a store call. The
// others are decided by their rule's kind: a concurrency rule takes or
// gives back a slot, a rule of 0 requests per unit denies, a rule of
// several limits decides them together (spendSet), a stream-done call
// charges its hits, any other call spends them. A dry-run rule's
// denial is answered OK. The answer is written in place rather than
// returned: answer is on the way to the store, and a returned copy would
// take room in two frames there.
func (s *Server) answer(q *engine.Request, req *pb.RateLimitRequest, d *rlv3.RateLimitDescriptor, it *item, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration, a *answered) {
	r := it.rule
	switch {
	case r == nil || it.dropped:
		st.Code = pb.RateLimitResponse_OK
		return
	case r.Unlimited:
		st.Code = pb.RateLimitResponse_OK
		st.LimitRemaining = math.MaxUint32
		a.o = engine.Unlimited
		return
	}
	if r.Rollout != nil && it.state != nil && r.Concurrency == nil {
		s.chooseArm(q, req.Domain, d.GetEntries(), it, hitsOf(req, d))
		r = it.rule
	}
	if it.state != nil {
		st.CurrentLimit = it.state.limit // a set's: that of the limit that decides (spendSet)
	} else {
		st.CurrentLimit = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: r.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(r.Unit)}
	}
	hits := hitsOf(req, d)
	a.decided = true
	switch {
	case r.Concurrency != nil:
		a.o, a.res = s.concurrent(q, req.Domain, d.GetEntries(), it, hits, st, reset)
	case r.DenyAll():
		a.o, a.res = s.denyAll(r, hits, st, reset)
	case r.Set != nil:
		a.o, a.res, a.set, a.at = s.spendSet(q, req.Domain, d.GetEntries(), it, hits, it.phase == phaseStreamDone, st, reset)
	case it.phase == phaseStreamDone:
		a.o, a.res = s.charge(q, req.Domain, d.GetEntries(), it, hits, st, reset)
	default:
		a.o, a.res = s.spend(q, req.Domain, d.GetEntries(), it, hits, st, reset)
	}
	switch {
	case a.o == engine.Denied && r.DryRun:
		a.o = engine.DryRunDenied
	case a.o == engine.FailedClosed:
		st.DurationUntilReset = roundUp(s.failRetry, reset)
	}
	st.Code = pb.RateLimitResponse_OK
	if a.o.Blocks() {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
	}
}

// count counts the answers of req's descriptors: each in
// tollgate_serve_decisions_total by its outcome, and the hits of each that
// a limit decided in envoy's statistics. A descriptor without a rule was
// counted by match (tollgate_serve_no_rule_total); one of a replaced rule
// is not counted.
func (s *Server) count(req *pb.RateLimitRequest, items []item, answers []answered) {
	for i, d := range req.GetDescriptors() {
		it, a := &items[i], &answers[i]
		if !a.decided && a.o != engine.Unlimited {
			continue
		}
		name := "" // the rule's own, kept in its state
		if it.state == nil || it.rule.HasValueToMetric() {
			// detailed_metric, value_to_metric and override limits: the
			// name depends on the request, within bounds (metricnames.go).
			name = s.names.of(it.rule, d.GetEntries())
		}
		s.countDecision(it, name, a.o)
		if it.rollout {
			s.countArm(it.rule, it.arm, a.o)
		}
		switch n := cost(hitsOf(req, d), it.rule.Cost); {
		case !a.decided: // envoy's statistics leave unlimited rules out
		case a.set != nil:
			s.countSet(it, d.GetEntries(), name, a, n)
		default:
			s.countEnvoy(it, name, s.envoyHits(ruleCapacity(it.rule), a.o, n, a.res))
		}
	}
}

// countDecision counts outcome o of a descriptor of the rule of it in
// tollgate_serve_decisions_total, under statistics name name ("": the
// rule's own).
func (s *Server) countDecision(it *item, name string, o engine.Outcome) {
	if name == "" {
		it.state.counter(s.m, o).Inc()
		return
	}
	s.m.decisions.WithLabelValues(it.rule.Domain, name, decisionLabels[o]).Inc()
}

// overall is the request's overall code, which it counts as the answer to
// a request that came via: OVER_LIMIT when a descriptor a limit decided is
// over it — except that quota rules are over together only, when every
// one of them is, and that the global dry run answers OK.
func (s *Server) overall(via api, items []item, answers []answered) pb.RateLimitResponse_Code {
	code := pb.RateLimitResponse_OK
	quota, quotaOver := 0, 0
	for i := range items {
		a := &answers[i]
		if !a.decided {
			continue
		}
		switch {
		case items[i].rule.QuotaMode || s.envoy.quotaMode:
			quota++
			if a.o.Blocks() {
				quotaOver++
			}
		case a.o.Blocks():
			code = pb.RateLimitResponse_OVER_LIMIT
		}
	}
	if quota > 0 && quota == quotaOver {
		code = pb.RateLimitResponse_OVER_LIMIT
	}
	if code == pb.RateLimitResponse_OVER_LIMIT && s.dryRun {
		code = pb.RateLimitResponse_OK
		s.m.globalDryRun.Inc()
		if s.sink != nil {
			s.sink.GlobalShadowMode()
		}
	}
	if code == pb.RateLimitResponse_OVER_LIMIT {
		s.m.requests[via][codeOverLimit].Inc()
	} else {
		s.m.requests[via][codeOK].Inc()
	}
	return code
}

// headerFields writes the rate-limit header fields of the answer in p, one
// policy per descriptor a rate decided, named after its rule (and one per
// limit of a set, named after the limit, of which RateLimit carries the
// one that decided: set.go): into its
// response_headers_to_add when inResponse, else into the header it
// returns (nil when there are none). A concurrency rule's slots are not a
// rate, and neither is a charge or a failure mode's answer; but a request
// turned away because a rule failed closed gets a Retry-After
// (WithFailClosedRetryAfter).
func (s *Server) headerFields(p *parts, items []item, answers []answered, inResponse bool) http.Header {
	if s.hdr.flavor == 0 {
		return nil
	}
	var stack [4]headers.Decision
	hds := stack[:0]
	var failWait time.Duration
	for i := range items {
		a := &answers[i]
		if a.o == engine.FailedClosed && p.resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
			failWait = s.failRetry
		}
		if a.decided && a.set != nil && rated(a.o) {
			hds = s.setDecisions(hds, items[i].rule, a)
			continue
		}
		if a.decided && items[i].rule.Concurrency == nil && rated(a.o) {
			hd := headerDecision(items[i].rule, a.o, a.res)
			if s.envoy.compat && a.o != engine.Allowed {
				// spend spent what was left (spendDenied) and answered
				// limit_remaining 0: the fields say the same.
				hd.Result.Remaining = 0
			}
			hds = append(hds, hd)
			if items[i].rollout && items[i].arm == rollout.Announced {
				hds = append(hds, announcement(items[i].rule))
			}
		}
	}
	if inResponse {
		s.addHeaders(p, hds, failWait, p.resp.OverallCode)
		return nil
	}
	return s.httpHeader(hds, failWait, p.resp.OverallCode)
}
