package service

import (
	"context"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// call is one ShouldRateLimit of a flow: its descriptors, and the overall
// code it must get ("" when the answer does not matter, as Envoy ignores
// the answer to a stream-done call).
type call struct {
	what  string
	descs []*rlv3.RateLimitDescriptor
	want  string
}

// d makes a descriptor of key, value pairs with hits_addend hits (< 0:
// none).
func d(hits int64, pairs ...string) *rlv3.RateLimitDescriptor {
	desc := &rlv3.RateLimitDescriptor{Entries: entries(pairs...)}
	if hits >= 0 {
		desc.HitsAddend = wrapperspb.UInt64(uint64(hits))
	}
	return desc
}

func runFlow(t *testing.T, s *Server, calls []call) {
	t.Helper()
	for i, c := range calls {
		resp := ask(t, s, &pb.RateLimitRequest{Domain: "llm", Descriptors: c.descs})
		if c.want != "" && resp.OverallCode.String() != c.want {
			t.Fatalf("call %d (%s): %s, want %s", i, c.what, codesOf(resp), c.want)
		}
	}
}

// TestStreamDoneCharge: the call Envoy makes when a stream is done
// (apply_on_stream_done), marked by a tollgate.phase=stream_done entry,
// charges its hits_addend to the counter the request started on, even
// past what is left: the next request is over the limit.
func TestStreamDoneCharge(t *testing.T) {
	t.Parallel()
	const rules = `
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: ALG}
`
	done := func(hits int64, pairs ...string) *rlv3.RateLimitDescriptor {
		return d(hits, append(pairs, PhaseKey, PhaseStreamDone)...)
	}
	for _, alg := range []string{"fixed_window", "token_bucket", "sliding_window_counter", "sliding_window_log", "gcra", "leaky_bucket"} {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			for _, tc := range []struct {
				name  string
				calls []call
			}{
				{"the rest at stream end, past what is left", []call{
					{"start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
					{"done: 150 tokens", []*rlv3.RateLimitDescriptor{done(150, "tenant", "acme")}, ""},
					{"next start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OVER_LIMIT"},
					{"another tenant", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "other")}, "OK"},
				}},
				{"two streams charge both", []call{
					{"start a", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
					{"start b", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
					{"done a: 60", []*rlv3.RateLimitDescriptor{done(60, "tenant", "acme")}, ""},
					{"done b: 60", []*rlv3.RateLimitDescriptor{done(60, "tenant", "acme")}, ""},
					{"next start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OVER_LIMIT"},
				}},
				{"within the limit", []call{
					{"start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
					{"done: 50", []*rlv3.RateLimitDescriptor{done(50, "tenant", "acme")}, "OK"},
					{"next start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
					{"a look at the counter", []*rlv3.RateLimitDescriptor{d(48, "tenant", "acme")}, "OK"},
					{"one more than is left", []*rlv3.RateLimitDescriptor{d(49, "tenant", "acme")}, "OVER_LIMIT"},
				}},
				{"a start that only looks, the whole cost at the end", []call{
					{"start: a look", []*rlv3.RateLimitDescriptor{d(0, "tenant", "acme")}, "OK"},
					{"done: 100", []*rlv3.RateLimitDescriptor{done(100, "tenant", "acme")}, ""},
					{"next start", []*rlv3.RateLimitDescriptor{d(1, "tenant", "acme")}, "OVER_LIMIT"},
				}},
				{"per descriptor", []call{
					{"start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme"), d(-1, "tenant", "beta")}, "OK"},
					{"done: acme 100, beta 10", []*rlv3.RateLimitDescriptor{done(100, "tenant", "acme"), done(10, "tenant", "beta")}, ""},
					{"acme is out", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OVER_LIMIT"},
					{"beta is not", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "beta")}, "OK"},
				}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					s := newTestServer(t, strings.ReplaceAll(rules, "ALG", alg))
					runFlow(t, s, tc.calls)
				})
			}
		})
	}
}

// TestStreamDoneChargeAboveMaxHits: a stream-done charge is bounded by the
// rule's capacity, not refused: a response may report more tokens than
// WithMaxHits lets a request-start call spend, and refusing the charge
// would count none of them.
func TestStreamDoneChargeAboveMaxHits(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: llm\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100000, algorithm: token_bucket}\n")
	for _, tc := range []struct {
		name  string
		calls []call
	}{
		{"charged past max hits", []call{
			{"start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
			{"done: 1,000,000 tokens", []*rlv3.RateLimitDescriptor{d(1_000_000, "tenant", "acme", PhaseKey, PhaseStreamDone)}, "OK"},
			{"next start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OVER_LIMIT"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { runFlow(t, s, tc.calls) })
	}
	// A request-start call past the bound is still refused.
	_, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{d(DefaultMaxHits+1, "tenant", "beta")}})
	if got, want := status.Code(err), codes.InvalidArgument; got != want {
		t.Errorf("a start past max hits: %v, want %v", err, want)
	}
}

// TestStreamDoneChargeDebt: a charge past what is left becomes a debt the
// next requests wait out — here 150 tokens charged with 99 left, so the next
// token comes once 52 have refilled at 100 a minute (31.2 s), not 0.6 s as
// if the tenant had spent exactly its limit.
func TestStreamDoneChargeDebt(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: llm\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}\n")
	runFlow(t, s, []call{
		{"start", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
		{"done: 150 tokens", []*rlv3.RateLimitDescriptor{d(150, "tenant", "acme", PhaseKey, PhaseStreamDone)}, "OK"},
	})
	resp := ask(t, s, &pb.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}})
	st := resp.Statuses[0]
	if got, want := st.Code, pb.RateLimitResponse_OVER_LIMIT; got != want {
		t.Fatalf("next start: %v, want %v", got, want)
	}
	// 31.2 s rounded up; 31 s if the machine stalled 0.2 s in between.
	if got := st.DurationUntilReset.AsDuration(); got < 31*time.Second || got > 32*time.Second {
		t.Errorf("next start: duration_until_reset %v, want 32s (52 tokens at 100 a minute, rounded up)", got)
	}
}
