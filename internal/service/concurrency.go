package service

import (
	"context"
	"errors"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/door/engine"
)

// concurrent answers a descriptor of a concurrency rule: at the request's
// start it takes a slot (OVER_LIMIT when none is free), named by the
// descriptor's PermitKey entry when it has one; when the stream is done it
// releases the slot of that name. The counter is the descriptor's, as a
// rate rule's, in the concurrency store. A look (hits 0) takes nothing and
// answers OK.
func (s *Server) concurrent(q *engine.Request, domain string, entries []*rlv3.RateLimitDescriptor_Entry, it *item, hits int, st *pb.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration) (engine.Outcome, tollgate.Result) {
	r, c := it.rule, it.rule.Concurrency
	p := s.pointOf(it)
	if hits == 0 {
		return engine.Allowed, tollgate.Result{Allowed: true}
	}
	key := counterKey(domain, entries, r)
	if it.phase == phaseStreamDone {
		err := s.storeCall(q, p, func(ctx context.Context) error {
			if s.conc == nil {
				return errNoConcurrencyStore
			}
			return s.conc.Release(ctx, tollgate.Permit{Key: key, ID: tollgate.PermitID(it.permit)})
		})
		if err != nil {
			o := failed(p)
			traceStoreFailure(q.Context(), o, err)
			return o, tollgate.Result{}
		}
		return engine.Released, tollgate.Result{Allowed: true}
	}
	var res tollgate.ConcurrencyResult
	err := s.storeCall(q, p, func(ctx context.Context) (err error) {
		switch {
		case s.conc == nil:
			return errNoConcurrencyStore
		case it.permit == "":
			_, res, err = s.conc.Acquire(ctx, key, c.Max, c.Lease)
		default:
			_, res, err = s.conc.AcquireID(ctx, key, tollgate.PermitID(it.permit), c.Max, c.Lease)
		}
		return err
	})
	if err != nil {
		o := failed(p)
		traceStoreFailure(q.Context(), o, err)
		return o, tollgate.Result{}
	}
	st.LimitRemaining = uint32(max(res.Remaining, 0))
	out := tollgate.Result{Allowed: res.Allowed, Remaining: res.Remaining, RetryAfter: res.RetryAfter}
	if !res.Allowed {
		st.DurationUntilReset = roundUp(res.RetryAfter, reset)
		return engine.Denied, out
	}
	return engine.Allowed, out
}

// storeCall runs call through the engine, as every store call of the
// rule at p: under the request's deadline, timed, and when it fails
// counted and logged as answered by the rule's failure mode.
func (s *Server) storeCall(q *engine.Request, p *engine.Point, call func(context.Context) error) error {
	return q.Call(p, "", failed(p).String(), "tollgate: store failed; answered by the rule's failure mode", call)
}

// errNoConcurrencyStore: a concurrency rule on a server without
// WithConcurrencyStore.
var errNoConcurrencyStore = errors.New("server: a concurrency rule, but no concurrency store (WithConcurrencyStore)")
