package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/door/ruleset"
)

// Settle makes a Rule's Cost an estimate, corrected once the call is done,
// as httplimit.Settle does for HTTP: the rule reserves the estimate before
// the handler runs, and when the handler returns, each policy that
// admitted the call is settled to its real cost (a refund, an extra charge
// the key's next calls wait out, or nothing). What each algorithm can
// settle is described at tollgate.Settler.
//
// The real cost is, in this order: 0 when Refund says so of the call's
// status code; what Func returns; or the number in the Trailer metadata
// the handler set (grpc.SetTrailer, or ServerStream.SetTrailer). Without
// one of them the estimate stands. A stream is settled once, when its
// handler returns.
//
// The store must be a tollgate.Settler (memorystore and redisstore are):
// New refuses the rule otherwise. A settle is a store call made after the
// handler returns, in the background, so that the client never waits for
// it: bounded by enforce.WithTimeout like every store call, on a context the end of
// the call does not cancel, and when the store fails or misses the
// deadline, counted in tollgate_grpc_store_errors_total and logged,
// sampled, the estimate standing. A call the Limiter turns away was not
// served: its reservations are refunded. Limiter.Drain waits for the
// settles in flight.
//
// The rate-limit header metadata describes the reservation: it is sent
// before the response, when only the estimate is known.
type Settle struct {
	// Trailer names the trailer metadata key in which the handler reports
	// the real cost, such as "x-tokens-used". Its value must be one decimal
	// number from 0 to 2^53 − 1: anything else (several values, a sign,
	// not a number, more) is never trusted: the estimate stands, and it is
	// counted in tollgate_grpc_bad_costs_total and logged without the
	// value. A number too large for a policy is bounded by the store
	// (tollgate.CheckSettle): one settle charges at most the policy's
	// Capacity plus its MaxDebt beyond the estimate.
	Trailer string
	// Func, if set instead of Trailer, says the real cost from the call's
	// status code and the trailer metadata the handler set; false leaves
	// the estimate standing. A negative cost is counted and logged as
	// Trailer's bad values are.
	Func func(code codes.Code, trailer metadata.MD) (cost int, ok bool)
	// Refund, if set, refunds the whole estimate of a call whose status
	// code it returns true for: ServerError refunds the server's own
	// failures.
	Refund func(code codes.Code) bool
	// Hide removes Trailer from the trailer metadata the client gets: it
	// is an internal signal between the handler and the limiter.
	Hide bool
}

// ServerError reports whether code is a failure of the server rather than
// the client: Unknown, Internal, Unavailable or DataLoss. A Settle.Refund
// for APIs that do not charge for their own errors.
func ServerError(code codes.Code) bool {
	switch code {
	case codes.Unknown, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// settler is one Rule's Settle, checked.
type settler struct {
	trailer string // lower-cased; "" with Func
	func_   func(codes.Code, metadata.MD) (int, bool)
	refund  func(codes.Code) bool
	hide    bool
}

func newSettler(rule string, s *Settle) (*settler, error) {
	name := strings.ToLower(s.Trailer)
	switch {
	case s.Trailer == "" && s.Func == nil && s.Refund == nil:
		return nil, fmt.Errorf("grpclimit: rule %q: Settle needs a Trailer, a Func or a Refund", rule)
	case s.Trailer != "" && s.Func != nil:
		return nil, fmt.Errorf("grpclimit: rule %q: Settle takes a Trailer or a Func, not both", rule)
	case s.Hide && s.Trailer == "":
		return nil, fmt.Errorf("grpclimit: rule %q: Settle.Hide hides Trailer, which is not set", rule)
	case s.Trailer != "" && (strings.ContainsAny(name, ": \t") || strings.HasPrefix(name, "grpc-")):
		return nil, fmt.Errorf("grpclimit: rule %q: Settle.Trailer %q is not a metadata key of the application", rule, s.Trailer)
	}
	return &settler{trailer: name, func_: s.Func, refund: s.Refund, hide: s.Hide}, nil
}

var errBadTrailer = errors.New("grpclimit: the real cost trailer")

// actual is the real cost of a call that ended with code and set trailer.
func (s *settler) actual(code codes.Code, trailer metadata.MD) (int, bool, error) {
	if s.refund != nil && s.refund(code) {
		return 0, true, nil
	}
	if s.func_ != nil {
		n, ok := s.func_(code, trailer)
		return n, ok, nil
	}
	if s.trailer == "" {
		return 0, false, nil
	}
	n, ok, err := ruleset.ParseCost(trailer[s.trailer])
	if err != nil {
		return 0, false, fmt.Errorf("%w %s: %w", errBadTrailer, s.trailer, err)
	}
	return n, ok, nil
}

// meter records the trailer metadata a handler sets, and keeps the hidden
// keys from the client. It stands for the call's transport stream, which
// grpc.SetTrailer reaches through the context, and for a stream's
// ServerStream.
type meter struct {
	grpc.ServerTransportStream
	hide    []string
	mu      sync.Mutex
	trailer metadata.MD
}

// SetTrailer records md and passes it on, without the hidden keys.
func (m *meter) SetTrailer(md metadata.MD) error {
	m.record(md)
	md = m.strip(md)
	if md.Len() == 0 {
		return nil
	}
	return m.ServerTransportStream.SetTrailer(md)
}

func (m *meter) record(md metadata.MD) {
	m.mu.Lock()
	m.trailer = metadata.Join(m.trailer, md)
	m.mu.Unlock()
}

func (m *meter) strip(md metadata.MD) metadata.MD {
	if len(m.hide) == 0 {
		return md
	}
	var out metadata.MD
	for k := range md {
		if slices.Contains(m.hide, strings.ToLower(k)) {
			if out == nil {
				out = md.Copy() // the handler's own stays whole
			}
			delete(out, k)
		}
	}
	if out == nil {
		return md
	}
	return out
}

func (m *meter) recorded() metadata.MD {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.trailer
}

// nopStream stands for a missing transport stream (a handler called
// without a server, in tests): trailers go nowhere.
type nopStream struct{ method string }

func (s nopStream) Method() string             { return s.method }
func (nopStream) SetHeader(metadata.MD) error  { return nil }
func (nopStream) SendHeader(metadata.MD) error { return nil }
func (nopStream) SetTrailer(metadata.MD) error { return nil }
func (l *Limiter) newMeter(ctx context.Context, method string) (*meter, context.Context) {
	ts := grpc.ServerTransportStreamFromContext(ctx)
	if ts == nil {
		ts = nopStream{method}
	}
	m := &meter{ServerTransportStream: ts, hide: l.hide}
	return m, grpc.NewContextWithServerTransportStream(ctx, m)
}

// meteredStream is a ServerStream whose trailers a meter records.
type meteredStream struct {
	grpc.ServerStream
	ctx context.Context
	m   *meter
}

func (s *meteredStream) Context() context.Context { return s.ctx }

func (s *meteredStream) SetTrailer(md metadata.MD) {
	s.m.record(md)
	if md = s.m.strip(md); md.Len() > 0 {
		s.ServerStream.SetTrailer(md)
	}
}

// settle settles the reservations in s of a call that ended with err,
// having set the trailers m recorded.
func (l *Limiter) settle(ctx context.Context, s *ruleset.Scratch, m *meter, err error) {
	code := status.Code(err)
	trailer := m.recorded()
	l.rules.Settle(ctx, s, func(rule int) (int, bool, error) {
		if st := l.settlers[rule]; st != nil {
			return st.actual(code, trailer)
		}
		return 0, false, nil
	})
}

// Drain waits until the settles of the calls already answered (see
// Settle) have reached the store or given up, or until ctx ends, and
// returns ctx's error then. Call it when shutting down, after
// grpc.Server.GracefulStop, so that the last corrections are not lost.
func (l *Limiter) Drain(ctx context.Context) error {
	if l.rules == nil {
		return nil // a concurrency limit settles nothing
	}
	return l.rules.Drain(ctx)
}
