package service

import (
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate/internal/door/engine"
)

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
