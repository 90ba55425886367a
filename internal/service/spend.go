package service

import (
	"math"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// What a rate rule does with a descriptor's hits: spend them through the
// engine (spend), charge them after the fact on a stream-done call
// (charge), or, for a rule of 0 requests per unit, deny them without a
// store call (denyAll); and the arithmetic of their answers.

// spend spends hits of the rule of it through the engine and fills st
// (and reset, its duration_until_reset) from its result.
func (s *Server) spend(q *engine.Request, domain string, entries []*rlv3.RateLimitDescriptor_Entry, it *item, hits int, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration) (engine.Outcome, tollgate.Result) {
	r := it.rule
	p := s.pointOf(it)
	key := counterKey(domain, entries, r)
	step := s.spendOrPenalty(q, p, key, r, cost(hits, r.Cost))
	res := step.Result
	switch step.Outcome {
	case engine.FailedOpen, engine.FailedClosed:
		traceStoreFailure(q.Context(), step.Outcome, step.Err)
		return step.Outcome, res
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
		if s.envoy.compat {
			s.spendDenied(q, p, key, r, res)
			st.LimitRemaining = 0
		}
	}
	return engine.Denied, res
}

// spendOrPenalty spends n of rule r for key, unless r has a penalty that
// runs for key: then it denies to the penalty's end. A denial of such a
// rule counts towards its penalty, and when it starts one, it waits the
// penalty out too.
func (s *Server) spendOrPenalty(q *engine.Request, p *engine.Point, key string, r *config.Rule, n int) engine.Step {
	if r.Penalty == nil {
		return q.Spend(p, "", key, r.Limit, n)
	}
	if st, out := q.Penalized(p, "", key, r.Limit, r.Penalty); out {
		return st
	}
	st := q.Spend(p, "", key, r.Limit, n)
	if (st.Outcome == engine.Denied || st.Outcome == engine.DryRunDenied) && st.Err == nil {
		if started, wait := q.Trip(p, "", key, r.Penalty); started {
			st.Result.RetryAfter = max(st.Result.RetryAfter, wait)
			s.m.penalties.WithLabelValues(r.Domain, r.ID).Inc()
		}
	}
	return st
}

// rated reports whether o is a rate's decision, for which the store said
// where the counter stands: allowed or over the limit, dry run or not. A
// failure mode's answer, a charge or a slot given back is not.
func rated(o engine.Outcome) bool {
	return o == engine.Allowed || o == engine.Denied || o == engine.DryRunDenied
}

// remaining is what res says remains, as limit_remaining holds it.
func remaining(res tollgate.Result) uint32 {
	return uint32(min(max(int64(res.Remaining), 0), math.MaxUint32))
}

// charge is the stream-done call of a rate rule: hits × cost charged to
// the descriptor's counter after the fact, even past what is left, so that
// the request's real cost, known only at its end, counts and the requests
// after it wait it out (a settle with no reservation, see tollgate.Settler:
// a debt of at most one capacity beyond the limit, what goes past it not
// recorded). The store must be a tollgate.Settler, as memorystore,
// redisstore and tiered over redisstore are; with another the charge fails
// and the rule's failure mode answers.
//
// The answer is OK (Envoy does not read it); its limit_remaining and
// duration_until_reset say where the counter stands after the charge.
func (s *Server) charge(q *engine.Request, domain string, entries []*rlv3.RateLimitDescriptor_Entry, it *item, hits int, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration) (engine.Outcome, tollgate.Result) {
	r := it.rule
	n := cost(hits, r.Cost)
	if n == 0 {
		return s.spend(q, domain, entries, it, hits, st, reset) // a look
	}
	p := s.pointOf(it)
	res, err := q.Charge(p, "", failed(p).String(), counterKey(domain, entries, r), r.Limit, n)
	if err != nil {
		o := failed(p)
		traceStoreFailure(q.Context(), o, err)
		return o, res
	}
	st.LimitRemaining = remaining(res)
	st.DurationUntilReset = roundUp(res.ResetAfter, reset)
	return engine.Charged, res
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

// pointOf is the engine's view of the rule of it.
func (s *Server) pointOf(it *item) *engine.Point {
	if it.state != nil {
		return &it.state.point
	}
	return s.overridePoint(it.rule)
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

// failed is the outcome of a rule at p whose store call failed.
func failed(p *engine.Point) engine.Outcome {
	if p.Mode == enforce.FailClosed && !p.DryRun {
		return engine.FailedClosed
	}
	return engine.FailedOpen
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

// cost is hits × the rule's cost, or math.MaxInt when that overflows.
func cost(hits, ruleCost int) int {
	n := hits * ruleCost
	if hits > 0 && n/hits != ruleCost {
		return math.MaxInt
	}
	return n
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
