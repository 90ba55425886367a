package service

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The codec must give exactly proto's bytes and messages: these tests set
// it against proto itself, over made-up messages and over any bytes.

func randomString(rng *rand.Rand) string {
	switch rng.IntN(5) {
	case 0:
		return ""
	case 1:
		return "héllo, wörld"
	case 2:
		return string([]byte{0xff, 'a'}) // not UTF-8
	}
	return "v" + strconv.Itoa(rng.IntN(100000))
}

func randomResponse(rng *rand.Rand) *pb.RateLimitResponse {
	r := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_Code(rng.IntN(3))}
	for range rng.IntN(4) {
		s := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_Code(rng.IntN(3)), LimitRemaining: rng.Uint32() >> rng.IntN(33)}
		if rng.IntN(4) > 0 {
			s.CurrentLimit = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: rng.Uint32() >> rng.IntN(33), Unit: pb.RateLimitResponse_RateLimit_Unit(rng.IntN(7)), Name: randomString(rng)}
			if rng.IntN(10) == 0 {
				s.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(3)
			}
		}
		if rng.IntN(4) > 0 {
			s.DurationUntilReset = &durationpb.Duration{Seconds: rng.Int64N(1<<40) - 1<<20, Nanos: rng.Int32N(2e9) - 1e9}
		}
		if rng.IntN(10) == 0 {
			s.Quota = &pb.RateLimitResponse_Quota{Requests: 5}
		}
		if rng.IntN(20) == 0 {
			s = nil
		}
		r.Statuses = append(r.Statuses, s)
	}
	for range rng.IntN(4) {
		h := &core.HeaderValue{Key: randomString(rng), Value: randomString(rng)}
		if rng.IntN(5) == 0 {
			h.RawValue = []byte(randomString(rng))
		}
		r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, h)
	}
	switch rng.IntN(12) {
	case 0:
		r.DynamicMetadata, _ = structpb.NewStruct(map[string]any{"domain": "d"})
	case 1:
		r.RequestHeadersToAdd = []*core.HeaderValue{{Key: "k", Value: "v"}}
	case 2:
		r.RawBody = []byte("body")
	case 3:
		r.Quota = &pb.RateLimitResponse_Quota{Requests: 1}
	}
	return r
}

func TestCodecMarshalsAsProto(t *testing.T) {
	t.Parallel()
	c := newRLSCodec()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		r := randomResponse(rng)
		want, wantErr := proto.Marshal(r)
		got, err := c.Marshal(r)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("response %d: error %v, proto's %v: %v", i, err, wantErr, r)
		}
		if err != nil {
			continue
		}
		if b := got.Materialize(); !bytes.Equal(b, want) {
			t.Fatalf("response %d: %x, proto's %x: %v", i, b, want, r)
		}
	}
}

func randomRequest(rng *rand.Rand) *pb.RateLimitRequest {
	r := &pb.RateLimitRequest{Domain: randomString(rng), HitsAddend: rng.Uint32() >> rng.IntN(33)}
	for range rng.IntN(4) {
		d := &rlv3.RateLimitDescriptor{}
		for range rng.IntN(4) {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: randomString(rng), Value: randomString(rng)})
		}
		switch rng.IntN(10) {
		case 0:
			d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7}
		case 1:
			d.HitsAddend = wrapperspb.UInt64(3)
		case 2:
			d.IsNegativeHits = true
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// sameDecoding checks that the codec decodes b exactly as proto does.
func sameDecoding(t *testing.T, b []byte) {
	t.Helper()
	want := new(pb.RateLimitRequest)
	wantErr := proto.Unmarshal(b, want)
	got := new(pb.RateLimitRequest)
	err := newRLSCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%x: error %v, proto's %v", b, err, wantErr)
	}
	if err == nil && !proto.Equal(got, want) {
		t.Fatalf("%x: %v, proto's %v", b, got, want)
	}
}

func TestCodecUnmarshalsAsProto(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		b, err := proto.Marshal(randomRequest(rng))
		if err != nil {
			continue // a string that is not UTF-8: its bytes come below
		}
		sameDecoding(t, b)
	}
	for _, b := range codecSeeds() {
		sameDecoding(t, b)
	}
}

// codecSeeds are requests in the wire format that proto refuses or reads
// with more than the codec's own decoder reads.
func codecSeeds() [][]byte {
	str := func(b []byte, num protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), m)
	}
	entry := str(str(nil, 1, "key"), 2, "value")
	desc := msg(nil, 1, entry)
	ok := msg(str(nil, 1, "domain"), 2, desc)
	return [][]byte{
		nil,
		ok,
		append(ok, ok...),                 // fields repeated: the last domain, every descriptor
		msg(str(nil, 1, "\xff"), 2, desc), // a domain that is not UTF-8
		msg(nil, 2, msg(nil, 1, str(nil, 2, "\xc3"))),                                    // a value that is not UTF-8
		msg(nil, 2, msg(nil, 1, str(nil, 3, "x"))),                                       // an unknown field in an entry
		msg(nil, 2, msg(desc, 5, nil)),                                                   // an unknown field in a descriptor
		str(ok, 9, "x"),                                                                  // an unknown field in the request
		protowire.AppendVarint(protowire.AppendTag(ok, 1, protowire.VarintType), 5),      // a field of another wire type
		protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 1<<40), // a hits_addend past 32 bits
		ok[:len(ok)-1], // cut short
		{0x00},         // field number 0
		{0x12, 0x80},   // a length cut short
	}
}

func FuzzCodecUnmarshal(f *testing.F) {
	for _, b := range codecSeeds() {
		f.Add(b)
	}
	f.Fuzz(sameDecoding)
}

// BenchmarkCodec sets the codec against proto's on a request of one
// descriptor and the service's answer to it.
func BenchmarkCodec(b *testing.B) {
	req, _ := proto.Marshal(&pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "v1234"}}}}})
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: []*pb.RateLimitResponse_DescriptorStatus{{
		Code:               pb.RateLimitResponse_OK,
		CurrentLimit:       &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 1000000, Unit: pb.RateLimitResponse_RateLimit_SECOND},
		LimitRemaining:     999999,
		DurationUntilReset: &durationpb.Duration{Seconds: 1},
	}}, ResponseHeadersToAdd: []*core.HeaderValue{{Key: "RateLimit-Policy", Value: `"bench";q=1000000;w=1`}, {Key: "RateLimit", Value: `"bench";r=999999;t=1`}}}
	for _, c := range []struct {
		name  string
		codec interface {
			Marshal(any) (mem.BufferSlice, error)
			Unmarshal(mem.BufferSlice, any) error
		}
	}{{"rls", newRLSCodec()}, {"proto", newRLSCodec().proto}} {
		b.Run(c.name+"/unmarshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(req)}, new(pb.RateLimitRequest)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/marshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}

// TestCodecKnowsEveryResponseField fails when a newer version of the
// messages has a field the codec's encoder does not know of: it would
// leave it out. Each such field must then be written, or make
// responseSize refuse the message to proto.
func TestCodecKnowsEveryResponseField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		m     proto.Message
		known string // the fields responseSize and appendResponse handle, by number
	}{
		{&pb.RateLimitResponse{}, "1 2 3 4 5 6 7"},
		{&pb.RateLimitResponse_DescriptorStatus{}, "1 2 3 4 5"},
		{&pb.RateLimitResponse_RateLimit{}, "1 2 3 4"},
		{&durationpb.Duration{}, "1 2"},
		{&core.HeaderValue{}, "1 2 3"},
	} {
		fields := c.m.ProtoReflect().Descriptor().Fields()
		var nums []int
		for i := range fields.Len() {
			nums = append(nums, int(fields.Get(i).Number()))
		}
		slices.Sort(nums)
		got := strings.Trim(fmt.Sprint(nums), "[]")
		if got != c.known {
			t.Errorf("%T has fields %s, the codec knows %s", c.m, got, c.known)
		}
	}
}
