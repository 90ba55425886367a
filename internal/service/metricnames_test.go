package service

import (
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricNamesBounded: statistics names taken from requests — the
// values of a detailed_metric or value_to_metric rule, a descriptor's own
// limit — get series of their own up to the bounds; past them they are
// counted under the domain's overflow name, and counted as folded. Names
// kept stay kept, and rules' own names are never folded.
func TestMetricNamesBounded(t *testing.T) {
	t.Parallel()
	const rules = `domain: d
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
`
	s := newTestServer(t, rules, WithMaxMetricNames(3), WithMaxMetricNameBytes(40))
	steps := []struct {
		req  *pb.RateLimitRequest
		name string // the rule label it is counted under
	}{
		{req("d", entries("user", "alice")), "d.user_alice"},
		{req("d", entries("path", "/a", "method", "GET")), "d.path_/a.method"},
		{req("d", entries("user", strings.Repeat("x", 40))), "d.__overflow__"}, // too long
		{req("d", entries("user", "bob")), "d.user_bob"},
		{req("d", entries("user", "carol")), "d.__overflow__"}, // a fourth name
		{req("d", entries("user", "alice")), "d.user_alice"},   // kept
		{req("d", entries("plain", "any")), "d.plain"},         // the rule's own
		{overrideReq("d", "k", "v"), "d.__overflow__"},         // a fourth name
	}
	want := map[string]float64{}
	for i, st := range steps {
		ask(t, s, st.req)
		want[st.name]++
		if got := testutil.ToFloat64(s.m.decisions.WithLabelValues("d", st.name, "ok")); got != want[st.name] {
			t.Errorf("step %d: decisions of %s = %v, want %v", i, st.name, got, want[st.name])
		}
	}
	if got, want := testutil.ToFloat64(s.names.folded[foldedTooLong]), 1.0; got != want {
		t.Errorf("folded too_long = %v, want %v", got, want)
	}
	if got, want := testutil.ToFloat64(s.names.folded[foldedTooMany]), 2.0; got != want {
		t.Errorf("folded too_many = %v, want %v", got, want)
	}
	if got, want := statsOf(s, OverflowName).total, 3.0; got != want {
		t.Errorf("envoy total_hits under %s = %v, want %v", OverflowName, got, want)
	}
	if got, want := testutil.CollectAndCount(s.m.decisions), 4+1; got != want {
		t.Errorf("%d decision series, want %d (three names, the rule's own and the overflow)", got, want)
	}
}

// overrideReq asks for descriptor k=v with a limit of its own, 100 a
// minute.
func overrideReq(domain, k, v string) *pb.RateLimitRequest {
	r := req(domain, entries(k, v))
	r.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_MINUTE}
	return r
}
