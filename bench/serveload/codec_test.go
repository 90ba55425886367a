package main

import (
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestLeanCodec: the lean codec reads the overall_code proto would read,
// past statuses and header fields, from one buffer or several, and sends a
// request's bytes as they are.
func TestLeanCodec(t *testing.T) {
	t.Parallel()
	full := func(code pb.RateLimitResponse_Code) *pb.RateLimitResponse {
		return &pb.RateLimitResponse{
			Statuses: []*pb.RateLimitResponse_DescriptorStatus{{Code: code, CurrentLimit: &pb.RateLimitResponse_RateLimit{Name: "n", RequestsPerUnit: 9},
				LimitRemaining: 3, DurationUntilReset: durationpb.New(7e9)}},
			ResponseHeadersToAdd: []*core.HeaderValue{{Key: "RateLimit", Value: `"n";r=3;t=7`}},
			OverallCode:          code,
		}
	}
	for _, tc := range []struct {
		name string
		resp *pb.RateLimitResponse
		want pb.RateLimitResponse_Code
	}{
		{"ok", full(pb.RateLimitResponse_OK), pb.RateLimitResponse_OK},
		{"over_limit", full(pb.RateLimitResponse_OVER_LIMIT), pb.RateLimitResponse_OVER_LIMIT},
		{"bare", &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OVER_LIMIT}, pb.RateLimitResponse_OVER_LIMIT},
		{"empty", &pb.RateLimitResponse{}, pb.RateLimitResponse_UNKNOWN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.Marshal(tc.resp)
			if err != nil {
				t.Fatal(err)
			}
			for _, data := range []mem.BufferSlice{
				{mem.SliceBuffer(b)},
				{mem.SliceBuffer(b[:len(b)/2]), mem.SliceBuffer(b[len(b)/2:])},
			} {
				got := overallCode{code: -1}
				if err := (leanCodec{}).Unmarshal(data, &got); err != nil {
					t.Fatal(err)
				}
				if got.code != tc.want {
					t.Errorf("overall code %v, want %v", got.code, tc.want)
				}
			}
		})
	}
	if err := (leanCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer{0x08}}, &overallCode{}); err == nil {
		t.Error("a truncated response decoded without an error")
	}
	req := encodedRequest("\x0a\x05bench")
	out, err := (leanCodec{}).Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out.Materialize()), string(req); got != want {
		t.Errorf("request sent as %q, want %q", got, want)
	}
}
