package service

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/headers"
)

const tenPerMinute = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: s\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"

// hitsReq asks for hits of descriptor k=v.
func hitsReq(k, v string, hits uint64) *pb.RateLimitRequest {
	r := req("d", entries(k, v))
	r.Descriptors[0].HitsAddend = wrapperspb.UInt64(hits)
	return r
}

type statsWant struct{ total, over, near, within, shadow float64 }

func statsOf(s *Server, key1 string) statsWant {
	v := func(i int) float64 { return testutil.ToFloat64(s.stats.vecs[i].WithLabelValues("d", key1, "")) }
	return statsWant{v(statTotalHits), v(statOverLimit), v(statNearLimit), v(statWithinLimit), v(statDryRun)}
}

// TestEnvoyStats: the per-rule statistics count hits as envoyproxy/ratelimit
// does (its base_limiter: over_limit, near_limit at 0.8 of the limit,
// within_limit, shadow_mode), with and without its counting of denied hits.
func TestEnvoyStats(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		compat bool
		key    string
		hits   []uint64
		want   statsWant
	}{
		// 8 within, then 9 and 10 pass the near-limit threshold of 8.
		{name: "up to the limit", key: "k", hits: []uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, want: statsWant{total: 10, within: 10, near: 2}},
		// At 10 of 10: all further hits are over.
		{name: "past the limit", key: "k", hits: []uint64{10, 1, 2}, want: statsWant{total: 13, within: 10, near: 2, over: 3}},
		// 7, then 5 more: 2 over, 2 near (8..10); tollgate spent nothing
		// on the denial, so 3 still pass.
		{name: "straddling", key: "k", hits: []uint64{7, 5, 3}, want: statsWant{total: 15, within: 10, near: 2 + 2, over: 2}},
		// The same in envoy compatibility: the denial spends the 3 left,
		// so the last 3 are all over.
		{name: "straddling, envoy", compat: true, key: "k", hits: []uint64{7, 5, 3}, want: statsWant{total: 15, within: 7, near: 2, over: 2 + 3}},
		{name: "shadow", key: "s", hits: []uint64{10, 2}, want: statsWant{total: 12, within: 10, near: 2, over: 2, shadow: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTestServer(t, tenPerMinute, WithEnvoyCompat(tc.compat))
			for _, h := range tc.hits {
				ask(t, s, hitsReq(tc.key, "v", h))
			}
			if got := statsOf(s, tc.key); got != tc.want {
				t.Errorf("stats %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestEnvoyCompat: over the limit, envoy reports nothing remaining, counts
// the denied hits, and sends no Retry-After; tollgate by default reports
// what is left and spends nothing on a denial.
func TestEnvoyCompat(t *testing.T) {
	t.Parallel()
	for _, compat := range []bool{false, true} {
		s := newTestServer(t, tenPerMinute, WithEnvoyCompat(compat), WithHeaders(headers.RateLimitFields),
			WithHeaderNames("X-Limit", "", "X-Reset"))
		ask(t, s, hitsReq("k", "v", 7))
		denied := ask(t, s, hitsReq("k", "v", 5))
		after := ask(t, s, hitsReq("k", "v", 1))
		wantRemaining, wantAfter := uint32(3), "OK: OK"
		if compat {
			wantRemaining, wantAfter = 0, "OVER_LIMIT: OVER_LIMIT"
		}
		if got := denied.Statuses[0].LimitRemaining; got != wantRemaining {
			t.Errorf("compat %v: limit_remaining %d over the limit, want %d", compat, got, wantRemaining)
		}
		if got := codesOf(after); got != wantAfter {
			t.Errorf("compat %v: 1 hit after the denial: %s, want %s", compat, got, wantAfter)
		}
		var names []string
		for _, h := range denied.ResponseHeadersToAdd {
			names = append(names, h.Key)
		}
		want := "[X-Limit RateLimit-Remaining X-Reset Retry-After]"
		if compat {
			want = "[X-Limit RateLimit-Remaining X-Reset]"
		}
		if got := fmtList(names); got != want {
			t.Errorf("compat %v: headers %s, want %s", compat, got, want)
		}
	}
}

func fmtList(s []string) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out + "]"
}

func TestEnvoyOptionsChecked(t *testing.T) {
	t.Parallel()
	for _, opt := range []Option{WithNearLimitRatio(0), WithNearLimitRatio(1.5), WithHeaderNames("bad name", "", ""), WithHeaderNames("X-A", "x-a", "")} {
		if _, err := New(nil, opt); err == nil {
			t.Errorf("an invalid option was accepted")
		}
	}
}

// TestGlobalQuotaMode: with envoy's QUOTA_MODE every rule is a quota rule:
// one over the limit of two does not deny the request.
func TestGlobalQuotaMode(t *testing.T) {
	t.Parallel()
	rules := "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	for _, quota := range []bool{false, true} {
		s := newTestServer(t, rules, WithQuotaMode(quota))
		r := req("d", entries("a", "x"), entries("b", "x"))
		ask(t, s, r)
		want := "OVER_LIMIT: OVER_LIMIT OK"
		if quota {
			want = "OK: OVER_LIMIT OK"
		}
		if got := codesOf(ask(t, s, r)); got != want {
			t.Errorf("quota mode %v: %s, want %s", quota, got, want)
		}
	}
}

func TestResponseMetadata(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, tenPerMinute, WithResponseMetadata(true))
	r := hitsReq("k", "v", 2)
	r.HitsAddend = 3
	got := ask(t, s, r).GetDynamicMetadata()
	want, err := structpb.NewStruct(map[string]any{
		"domain":      "d",
		"hitsAddend":  3,
		"descriptors": []any{map[string]any{"entries": []any{"k=v"}, "hitsAddend": 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("metadata %v, want %v", got, want)
	}
	if md := ask(t, newTestServer(t, tenPerMinute), r).GetDynamicMetadata(); md != nil {
		t.Errorf("metadata without the option: %v", md)
	}
}

// TestHealthServiceName: Kubernetes gRPC probes of an envoyproxy/ratelimit
// Deployment ask for the service "ratelimit".
func TestHealthServiceName(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, tenPerMinute)
	resp, err := s.health.Check(context.Background(), &grpc_health_v1.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.Status, grpc_health_v1.HealthCheckResponse_SERVING; got != want {
		t.Errorf("health of ratelimit: %v, want %v", got, want)
	}
}

// TestEnvoyCompatRemainingAgrees: whatever the flavour, the header fields
// report what limit_remaining reports, on gRPC and on /json. Over the limit
// in envoy compatibility that is 0: the denial spent what was left, so 0 is
// what remains (envoy's own RateLimit-Remaining is the status's
// limit_remaining); otherwise it is what is left, which fewer hits could
// still have.
func TestEnvoyCompatRemainingAgrees(t *testing.T) {
	t.Parallel()
	all := headers.Draft | headers.RateLimitFields | headers.XRateLimit
	tests := []struct {
		name   string
		compat bool
		hits   []uint64 // the last is the one looked at
		want   uint32
	}{
		{"within", false, []uint64{7}, 3},
		{"within, envoy", true, []uint64{7}, 3},
		{"denied", false, []uint64{7, 5}, 3},
		{"denied, envoy", true, []uint64{7, 5}, 0},
		{"denied at 0, envoy", true, []uint64{10, 1}, 0},
		{"dry run denied, envoy", true, []uint64{7, 5}, 0},
		{"above capacity", false, []uint64{11}, 0},
		{"above capacity, envoy", true, []uint64{11}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "k"
			if strings.HasPrefix(tc.name, "dry run") {
				key = "s"
			}
			s := newTestServer(t, tenPerMinute, WithEnvoyCompat(tc.compat), WithHeaders(all))
			var resp *pb.RateLimitResponse
			for _, h := range tc.hits {
				resp = ask(t, s, hitsReq(key, "grpc", h))
			}
			got := map[string]string{"limit_remaining": fmt.Sprint(resp.Statuses[0].LimitRemaining)}
			for _, h := range resp.ResponseHeadersToAdd {
				got[h.Key] = h.Value
			}
			checkRemaining(t, "gRPC", got, tc.want)

			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			var hdr http.Header
			var body string
			for _, h := range tc.hits {
				res, err := http.Post(srv.URL+"/json", "application/json",
					strings.NewReader(fmt.Sprintf(`{"domain":"d","descriptors":[{"entries":[{"key":%q,"value":"json"}],"hits_addend":%d}]}`, key, h)))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				hdr, body = res.Header, string(b)
			}
			var out pb.RateLimitResponse
			if err := protojson.Unmarshal([]byte(body), &out); err != nil {
				t.Fatalf("/json answer %q: %v", body, err)
			}
			got = map[string]string{"limit_remaining": fmt.Sprint(out.Statuses[0].LimitRemaining)}
			for k := range hdr {
				got[k] = hdr.Get(k)
			}
			checkRemaining(t, "/json", got, tc.want)
		})
	}
}

// checkRemaining checks that every field of got (header fields by name, and
// limit_remaining) that reports what remains reports want.
func checkRemaining(t *testing.T, via string, got map[string]string, want uint32) {
	t.Helper()
	w := fmt.Sprint(want)
	for name, v := range got {
		switch http.CanonicalHeaderKey(name) {
		case "Limit_remaining", "Ratelimit-Remaining", "X-Ratelimit-Remaining":
			if v != w {
				t.Errorf("%s: %s %s, want %s", via, name, v, w)
			}
		case "Ratelimit":
			if _, after, _ := strings.Cut(v, ";r="); !strings.HasPrefix(after, w+";") {
				t.Errorf("%s: RateLimit %s, want r=%s", via, v, w)
			}
		}
	}
	for _, name := range []string{"limit_remaining", "RateLimit"} {
		found := false
		for k := range got {
			found = found || strings.EqualFold(k, name)
		}
		if !found {
			t.Errorf("%s: no %s in %v", via, name, got)
		}
	}
}
