package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
)

// Envoy's rate limit filter calls the service twice for a request whose
// route has rate limits of both kinds: when the request starts, with the
// descriptors of the route's ordinary rate limits, and when its stream is
// done, with those of the rate limits marked apply_on_stream_done, whose
// hits_addend may come from the response (a format such as
// %DYNAMIC_METADATA(...)%). Both are plain ShouldRateLimit calls; Envoy
// ignores the answer to the second. A route tells the service which call
// is which, and which request a call belongs to, with two entries that the
// service takes out of a descriptor before matching it to a rule or naming
// its counter, so that both calls meet the same rule and counter:
const (
	// PhaseKey is the key of the entry that says which call a descriptor
	// belongs to: its value is PhaseRequest (the same as no such entry) or
	// PhaseStreamDone. A route's stream-done rate limit adds it with a
	// generic_key action {descriptor_key: tollgate.phase,
	// descriptor_value: stream_done}. Any other value is an invalid
	// request.
	PhaseKey = "tollgate.phase"
	// PhaseRequest marks the call made when the request starts.
	PhaseRequest = "request"
	// PhaseStreamDone marks the call made when the stream is done. For a
	// rate rule it charges the descriptor's hits (its hits_addend, else the
	// request's) to the counter, even past what is left, instead of
	// deciding: the work is done, and what it cost must count. For a
	// concurrency rule it releases the request's slot.
	PhaseStreamDone = "stream_done"
	// PermitKey is the key of the entry that names the request for a
	// concurrency rule, so that the stream-done call releases the slot the
	// request-start call took, on whichever replica it arrives: a request_headers
	// action {header_name: x-request-id, descriptor_key: tollgate.permit}.
	// The slot is named tollgate.PermitID(value). Rate rules ignore it.
	PermitKey = "tollgate.permit"
)

// phase is which call of a request a descriptor belongs to.
type phase uint8

const (
	phaseRequest phase = iota
	phaseStreamDone
)

// mark is what a descriptor's PhaseKey and PermitKey entries said.
type mark struct {
	phase  phase
	permit string // the PermitKey value; "" when none
}

// reservedPrefix starts both reserved keys: a descriptor whose keys do not
// start with it is passed on as it came, without a copy.
const reservedPrefix = "tollgate."

// stripMarks returns req with the PhaseKey and PermitKey entries taken out
// of its descriptors, and what they said, one mark per descriptor. A
// request without them (nearly every one) is returned as it is, with nil
// marks and no allocation. A phase it does not know is an invalid request.
func (s *Server) stripMarks(via api, req *pb.RateLimitRequest) (*pb.RateLimitRequest, []mark, error) {
	descs := req.GetDescriptors()
	first := -1
	for i, d := range descs {
		if hasReserved(d.GetEntries()) {
			first = i
			break
		}
	}
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

// streamDone reports whether entries mark a stream-done call.
func streamDone(entries []*rlv3.RateLimitDescriptor_Entry) bool {
	for _, e := range entries {
		if e.GetKey() == PhaseKey && e.GetValue() == PhaseStreamDone {
			return true
		}
	}
	return false
}

func hasReserved(entries []*rlv3.RateLimitDescriptor_Entry) bool {
	for _, e := range entries {
		if k := e.GetKey(); strings.HasPrefix(k, reservedPrefix) && (k == PhaseKey || k == PermitKey) {
			return true
		}
	}
	return false
}

// WithConcurrencyStore sets the store of the rules' concurrency limits
// (config.Concurrency): redisstore.Store for a limit shared by every
// replica, memorystore.Concurrency for one process. Without it a
// concurrency rule cannot decide and answers by its failure mode.
func WithConcurrencyStore(cs tollgate.ConcurrencyStore) Option {
	return func(s *Server) { s.conc = cs }
}

// errNoConcurrencyStore: a concurrency rule on a server without
// WithConcurrencyStore.
var errNoConcurrencyStore = errors.New("server: a concurrency rule, but no concurrency store (WithConcurrencyStore)")

// storeCall runs call through the engine, as every store call of the
// rule at p: under the request's deadline, timed, and when it fails
// counted and logged as answered by the rule's failure mode.
func (s *Server) storeCall(q *engine.Request, p *engine.Point, call func(context.Context) error) error {
	return q.Call(p, "", failed(p).String(), "tollgate: store failed; answered by the rule's failure mode", call)
}

// failed is the outcome of a rule at p whose store call failed.
func failed(p *engine.Point) engine.Outcome {
	if p.Mode == enforce.FailClosed && !p.DryRun {
		return engine.FailedClosed
	}
	return engine.FailedOpen
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

// pointOf is the engine's view of the rule of it.
func (s *Server) pointOf(it *item) *engine.Point {
	if it.state != nil {
		return &it.state.point
	}
	return s.overridePoint(it.rule)
}

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
