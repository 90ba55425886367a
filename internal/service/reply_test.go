package service

import (
	"context"
	"fmt"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/headers"
)

// replyText prints what a gRPC answer says, field by field: the overall
// code, each status (code, remaining, seconds until reset), and the header
// fields in order.
func replyText(resp *pb.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(resp.GetOverallCode().String())
	for _, st := range resp.GetStatuses() {
		fmt.Fprintf(&b, " [%s r=%d", st.GetCode(), st.GetLimitRemaining())
		if d := st.GetDurationUntilReset(); d != nil {
			fmt.Fprintf(&b, " t=%ds", d.GetSeconds())
		}
		b.WriteString("]")
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		fmt.Fprintf(&b, " %s: %s;", h.GetKey(), h.GetValue())
	}
	return b.String()
}

// TestReplies: the answer's pieces made together (one allocation for one
// descriptor, header fields in room kept for them, header maps reused
// between requests) say the same as they would made one by one: each
// status its own duration_until_reset, every header field of the flavour
// even when there are more than the room kept, and nothing left over from
// the request before.
func TestReplies(t *testing.T) {
	t.Parallel()
	const rules = `
domain: d
descriptors:
  - key: s
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: h
    rate_limit: {unit: hour, requests_per_unit: 9}
`
	steps := []struct {
		req  *pb.RateLimitRequest
		want string
	}{
		{req("d", entries("s", "a")),
			`OK [OK r=1 t=1s] RateLimit-Policy: "d.s";q=2;w=1; RateLimit: "d.s";r=1;t=1;`},
		{req("d", entries("s", "a"), entries("m", "a"), entries("h", "a")),
			`OK [OK r=0 t=1s] [OK r=4 t=60s] [OK r=8 t=3600s] RateLimit-Policy: "d.s";q=2;w=1, "d.m";q=5;w=60, "d.h";q=9;w=3600; RateLimit: "d.s";r=0;t=1, "d.m";r=4;t=60, "d.h";r=8;t=3600;`},
		{req("d", entries("s", "a")),
			`OVER_LIMIT [OVER_LIMIT r=0 t=1s] RateLimit-Policy: "d.s";q=2;w=1; RateLimit: "d.s";r=0;t=1; Retry-After: 1;`},
		{req("d", entries("m", "a")),
			`OK [OK r=3 t=60s] RateLimit-Policy: "d.m";q=5;w=60; RateLimit: "d.m";r=3;t=60;`},
		{req("d", entries("x", "a")), `OK [OK r=0]`},
	}
	for _, parallel := range []bool{false, true} {
		s := newTestServer(t, rules, WithParallelDescriptors(parallel))
		for i, st := range steps {
			resp, err := s.ShouldRateLimit(context.Background(), st.req)
			if err != nil {
				t.Fatalf("parallel %v, step %d: %v", parallel, i, err)
			}
			if got, want := replyText(resp), st.want; got != want {
				t.Errorf("parallel %v, step %d:\n got %s\nwant %s", parallel, i, got, want)
			}
		}
	}

	// Every flavour: nine fields, more than the room kept for one
	// descriptor's.
	s := newTestServer(t, rules, WithHeaders(headers.Draft|headers.RateLimitFields|headers.XRateLimit))
	for i, want := range []string{
		`OK [OK r=1 t=1s] RateLimit-Policy: "d.s";q=2;w=1; RateLimit: "d.s";r=1;t=1; RateLimit-Limit: 2; RateLimit-Remaining: 1; RateLimit-Reset: 1; X-RateLimit-Limit: 2; X-RateLimit-Remaining: 1; X-RateLimit-Reset: 1767225601;`,
		`OK [OK r=0 t=1s] RateLimit-Policy: "d.s";q=2;w=1; RateLimit: "d.s";r=0;t=1; RateLimit-Limit: 2; RateLimit-Remaining: 0; RateLimit-Reset: 1; X-RateLimit-Limit: 2; X-RateLimit-Remaining: 0; X-RateLimit-Reset: 1767225601;`,
		`OVER_LIMIT [OVER_LIMIT r=0 t=1s] RateLimit-Policy: "d.s";q=2;w=1; RateLimit: "d.s";r=0;t=1; RateLimit-Limit: 2; RateLimit-Remaining: 0; RateLimit-Reset: 1; X-RateLimit-Limit: 2; X-RateLimit-Remaining: 0; X-RateLimit-Reset: 1767225601; Retry-After: 1;`,
	} {
		resp, err := s.ShouldRateLimit(context.Background(), req("d", entries("s", "b")))
		if err != nil {
			t.Fatalf("all flavours, step %d: %v", i, err)
		}
		if got := replyText(resp); got != want {
			t.Errorf("all flavours, step %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// TestShouldRateLimitAllocations: the hot path stays lean. A request of one
// descriptor on the memory store, without a deadline, makes four
// allocations: the response with its status and header fields, the
// counter's key, the header values' string and the slice backing them;
// one of two descriptors ten. The bounds leave room for the race
// detector, under which sync.Pool drops some of what it is given; a
// response made piece by piece (16 allocations for one descriptor, 18 for
// two) is far above them.
func TestShouldRateLimitAllocations(t *testing.T) {
	s := newTestServer(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n", WithTimeout(0))
	for _, tc := range []struct {
		name string
		req  *pb.RateLimitRequest
		max  float64
	}{
		{"one descriptor", req("d", entries("k", "v")), 6},
		{"one descriptor, parallel descriptors on", req("d", entries("k", "v")), 6},
		{"two descriptors", req("d", entries("k", "v"), entries("k", "w")), 13},
		// Unmatched descriptors are logged once per interval: sampling the
		// others out allocates nothing.
		{"a descriptor no rule matches", req("d", entries("x", "v")), 2},
		{"an unknown domain", req("e", entries("k", "v")), 2},
	} {
		s.parallel = strings.Contains(tc.name, "parallel")
		got := testing.AllocsPerRun(200, func() {
			if _, err := s.ShouldRateLimit(context.Background(), tc.req); err != nil {
				t.Fatal(err)
			}
		})
		if got > tc.max {
			t.Errorf("%s: %v allocations per request, want at most %v", tc.name, got, tc.max)
		}
	}
}
