package main

import (
	"fmt"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// leanCodec is the gRPC mode's codec: it costs the load generator as
// little as a call can, so that the cores it shares with the service go to
// the service. A request goes out as bytes encoded once, before the run
// (encodedRequest), and of a response only overall_code is read — the one
// field serveload counts — skipping the rest unparsed. Proto's codec would
// encode every request anew and decode every response whole, statuses and
// header fields included: a sixth of the load generator's CPU, and more for
// a service whose responses carry more (response_headers_to_add). Both
// services get the same bytes and are read alike.
type leanCodec struct{}

// encodedRequest is a RateLimitRequest in its wire format.
type encodedRequest []byte

// overallCode receives the overall_code of a response.
type overallCode struct{ code pb.RateLimitResponse_Code }

// Marshal returns the bytes of an encodedRequest, without copying them:
// gRPC frees what Marshal returns, and freeing a mem.SliceBuffer does
// nothing, so the same bytes serve every call.
func (leanCodec) Marshal(v any) (mem.BufferSlice, error) {
	req, ok := v.(encodedRequest)
	if !ok {
		return nil, fmt.Errorf("serveload: lean codec cannot encode %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(req)}, nil
}

// Unmarshal reads the overall_code (field 1, an enum) of a RateLimitResponse
// into an *overallCode (readOverall).
func (leanCodec) Unmarshal(data mem.BufferSlice, v any) error {
	out, ok := v.(*overallCode)
	if !ok {
		return fmt.Errorf("serveload: lean codec cannot decode into %T", v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	var err error
	out.code, err = readOverall(b)
	return err
}

// readOverall reads the overall_code of a RateLimitResponse in wire format,
// checking that the rest is well-formed and skipping it. A response without
// the field has code UNKNOWN, proto3's zero value.
func readOverall(b []byte) (pb.RateLimitResponse_Code, error) {
	code := pb.RateLimitResponse_UNKNOWN
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("serveload: bad response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			c, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, fmt.Errorf("serveload: bad response: %w", protowire.ParseError(n))
			}
			code, b = pb.RateLimitResponse_Code(int32(c)), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, fmt.Errorf("serveload: bad response: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return code, nil
}

// Name is proto's: the calls are ordinary application/grpc calls.
func (leanCodec) Name() string { return "proto" }
