package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// answerer is a rate-limit service whose answer is in the request: value
// "deny" is over the limit, "fail" an error, anything else OK, with
// statuses and header fields as tollgate sends them.
type answerer struct {
	pb.UnimplementedRateLimitServiceServer
}

func (answerer) ShouldRateLimit(_ context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	v := req.GetDescriptors()[0].GetEntries()[0].GetValue()
	code := pb.RateLimitResponse_OK
	switch {
	case v == "fail":
		return nil, status.Error(codes.Unavailable, "no store")
	case strings.HasPrefix(v, "deny"):
		code = pb.RateLimitResponse_OVER_LIMIT
	}
	return &pb.RateLimitResponse{OverallCode: code,
		Statuses:             []*pb.RateLimitResponse_DescriptorStatus{{Code: code, LimitRemaining: 7}},
		ResponseHeadersToAdd: []*core.HeaderValue{{Key: "RateLimit", Value: `"` + v + `";r=7;t=1`}}}, nil
}

func serveAnswerer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(g, answerer{})
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

func request(t *testing.T, value string) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: value}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return grpcFrame(b)
}

// TestH2Client: the lean client's calls to a grpc-go server get the
// server's answers — codes, and errors as errors — from many callers at
// once on one connection, and one call failing leaves the others alone.
func TestH2Client(t *testing.T) {
	t.Parallel()
	c, err := dialH2(serveAnswerer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		value   string
		want    pb.RateLimitResponse_Code
		wantErr string
	}{
		{"ok", pb.RateLimitResponse_OK, ""},
		{"deny", pb.RateLimitResponse_OVER_LIMIT, ""},
		{"fail", 0, "grpc-status 14: no store"},
	} {
		cl := newH2call()
		err := c.call(shouldRateLimit, request(t, tc.value), cl)
		if tc.wantErr != "" {
			if err == nil || err.Error() != "serveload: "+tc.wantErr {
				t.Errorf("%s: error %v, want %q", tc.value, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.value, err)
		}
		got, err := readOverall(cl.msg)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s: overall code %v, want %v", tc.value, got, tc.want)
		}
	}

	reqs := map[string][]byte{"ok": request(t, "ok"), "deny": request(t, "deny"), "fail": request(t, "fail")}
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			cl := newH2call()
			for i := range 300 {
				v := [...]string{"ok", "deny", "fail"}[(w+i)%3]
				err := c.call(shouldRateLimit, reqs[v], cl)
				if v == "fail" {
					if err == nil {
						t.Errorf("call %d of caller %d: no error for a failing call", i, w)
					}
					continue
				}
				if err != nil {
					t.Errorf("call %d of caller %d: %v", i, w, err)
					return
				}
				got, err := readOverall(cl.msg)
				if want := map[string]pb.RateLimitResponse_Code{"ok": pb.RateLimitResponse_OK, "deny": pb.RateLimitResponse_OVER_LIMIT}[v]; err != nil || got != want {
					t.Errorf("call %d of caller %d: overall code %v (%v), want %v", i, w, got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestH2ClientClosed: calls on a connection the server has gone from fail
// rather than wait.
func TestH2ClientClosed(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(g, answerer{})
	go g.Serve(l)
	c, err := dialH2(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := newH2call()
	if err := c.call(shouldRateLimit, request(t, "ok"), cl); err != nil {
		t.Fatal(err)
	}
	g.Stop()
	for i := range 3 {
		if err := c.call(shouldRateLimit, request(t, "ok"), cl); err == nil {
			t.Errorf("call %d after the server stopped: no error", i)
		}
	}
}
