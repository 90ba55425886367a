package service

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bounds on one request. A request is built by a gateway from a route's
// configuration, so a real one has a handful of descriptors of a few
// entries each and is a few hundred bytes; the bounds are far above that
// and far below what would let one caller spend the service's memory or
// the store's time. A request past any of them is refused as a whole,
// before the store is asked anything: gRPC InvalidArgument, HTTP 400 (413
// for a body over the size), counted in tollgate_serve_invalid_total.
const (
	// DefaultMaxDescriptors is how many descriptors one request may carry
	// unless WithMaxDescriptors says otherwise. Each descriptor is one
	// store call within the request's deadline, one status in the answer
	// and one item in the RateLimit-Policy and RateLimit fields; 64 is
	// ten times what Envoy's richest route configurations send.
	DefaultMaxDescriptors = 64
	// DefaultMaxEntries is how many entries one descriptor may have unless
	// WithMaxEntries says otherwise. Rules nest one level per entry, and
	// rules files in the wild nest at most four or five deep.
	DefaultMaxEntries = 16
	// DefaultMaxHits is the largest hits_addend (request-wide or on a
	// descriptor) a caller may send unless WithMaxHits says otherwise. A
	// sliding_window_log rule writes one log entry per hit, so a call's
	// cost in Redis grows with its hits (a million hold Redis for seconds);
	// 1,000 keep one call near a millisecond. Raise it for rules of other
	// algorithms that count large amounts, such as bytes or tokens.
	DefaultMaxHits = 1000
	// DefaultMaxRequestBytes bounds one request's encoded size, a gRPC
	// message or a /json body, unless WithMaxRequestBytes says otherwise:
	// 64 KiB is 64 descriptors with a kilobyte of entries each.
	DefaultMaxRequestBytes = 64 << 10
)

// bounds are the bounds on one request in force: the defaults above, or
// what the options set.
type bounds struct {
	descriptors, entries, hits, bytes int
}

// WithMaxDescriptors sets how many descriptors one request may carry
// (default DefaultMaxDescriptors); a request with more is invalid. For the
// auth endpoint and the proxy it bounds the descriptor specs too. n ≤ 0
// keeps the default.
func WithMaxDescriptors(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.max.descriptors = n
		}
	}
}

// WithMaxEntries sets how many entries one descriptor may have (default
// DefaultMaxEntries); a request with a longer one is invalid. n ≤ 0 keeps
// the default.
func WithMaxEntries(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.max.entries = n
		}
	}
}

// WithMaxHits sets the largest hits_addend a caller may send, on the
// request or on a descriptor (default DefaultMaxHits); a request with a
// larger one is invalid. The rule's cost multiplies it afterwards, and a
// total above what the rule can ever admit at once (Limit.Capacity) is
// invalid too. A descriptor's hits_addend on a stream-done call
// (PhaseStreamDone) is not bounded by it: that charge spends at most its
// rule's capacity, however many hits it reports. n ≤ 0 keeps the default.
func WithMaxHits(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.max.hits = n
		}
	}
}

// WithMaxRequestBytes sets the largest request, in bytes: a /json body
// over it is answered 413, and GRPCServerOptions limits received gRPC
// messages to it (gRPC answers ResourceExhausted). Default
// DefaultMaxRequestBytes; n ≤ 0 keeps the default.
func WithMaxRequestBytes(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.max.bytes = n
		}
	}
}

// GRPCServerOptions returns the options the gRPC server that the Server is
// registered on (RegisterGRPC) should be made with: the largest message it
// receives (WithMaxRequestBytes) — without them grpc-go accepts 4 MB
// messages, hundreds of thousands of descriptors — and a codec that reads
// requests and writes responses without proto's reflection, to the same
// bytes (rlsCodec).
func (s *Server) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(s.max.bytes), grpc.ForceServerCodecV2(newRLSCodec())}
}

// invalidReason is why a request was refused as invalid: the reason label
// of tollgate_serve_invalid_total.
type invalidReason uint8

const (
	invalidRequest     invalidReason = iota // no domain, no descriptors, a body that does not decode
	invalidDescriptors                      // more descriptors than the bound
	invalidEntries                          // a descriptor with more entries than the bound
	invalidHits                             // a hits_addend above the bound
	invalidOverride                         // a descriptor's own limit no store can count with
	invalidTooLarge                         // a body over the size bound
	invalidAuth                             // the auth endpoint: a missing header, a bad path or query
	invalidPhase                            // a tollgate.phase it does not know, a release that names no permit
	numInvalid
)

var invalidNames = [numInvalid]string{"request", "too_many_descriptors", "too_many_entries", "hits", "override", "too_large", "auth", "phase"}

func (r invalidReason) String() string { return invalidNames[r] }

// invalid counts and returns the error of an invalid request:
// InvalidArgument, as envoyproxy/ratelimit refuses a request without a
// domain or descriptors. An invalid request is the caller's mistake: it
// is answered at once, never by a failure mode, and never counted or
// logged as a store failure.
func (s *Server) invalid(via api, reason invalidReason, msg string) error {
	s.countInvalid(via, reason)
	if s.sink != nil && (via == apiGRPC || via == apiJSON) {
		s.sink.CallFailed(false) // envoy's service_error
	}
	return status.Error(codes.InvalidArgument, "server: "+msg)
}

// countInvalid counts an invalid request that came via for reason.
func (s *Server) countInvalid(via api, reason invalidReason) {
	s.m.requests[via][codeInvalid].Inc()
	s.m.invalid[reason].Inc()
}
