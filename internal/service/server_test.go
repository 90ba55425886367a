package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/storekey"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/store/redisurl"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

func entries(pairs ...string) []*rlv3.RateLimitDescriptor_Entry {
	var out []*rlv3.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, &rlv3.RateLimitDescriptor_Entry{Key: pairs[i], Value: pairs[i+1]})
	}
	return out
}

func TestCounterKeysNeverCollide(t *testing.T) {
	t.Parallel()
	r := &config.Rule{}
	tests := [][]*rlv3.RateLimitDescriptor_Entry{
		entries("a", "b|c=d"),
		entries("a", "b", "c", "d"),
		entries("a=b", "c"),
		entries("a", "b=c"),
		entries("a", `b\`, "c", "d"),
		entries("a", `b\|c=d`),
	}
	seen := map[string]int{}
	for i, e := range tests {
		k := counterKey("d", e, r)
		if j, dup := seen[k]; dup {
			t.Errorf("descriptors %d and %d share the key %q", j, i, k)
		}
		seen[k] = i
	}
	if got, want := counterKey("edge", entries("remote_address", "10.0.0.1"), r), "rl|edge|remote_address=10.0.0.1"; got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	long := counterKey("d", entries("path", strings.Repeat("x", 600)), r)
	if len(long) > tollgate.MaxKeyLen || !strings.HasPrefix(long, "rl#") {
		t.Errorf("long key %q (%d bytes), want a hash within %d bytes", long[:20], len(long), tollgate.MaxKeyLen)
	}
	if long2 := counterKey("d", entries("path", strings.Repeat("x", 599)+"y"), r); long2 == long {
		t.Errorf("two long keys hash alike")
	}
}

func newTestServer(t testing.TB, rules string, opts ...Option) *Server {
	t.Helper()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	// A deadline no loaded test machine misses: a decision answered by
	// the failure mode would fail a test about decisions. Tests of the
	// deadline pass their own.
	opts = append([]Option{WithClock(clock), WithTimeout(time.Minute), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	s, err := New(memorystore.New(memorystore.WithClock(clock)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	r, err := config.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(r)
	return s
}

func codesOf(r *pb.RateLimitResponse) string {
	s := r.OverallCode.String() + ":"
	for _, st := range r.Statuses {
		s += " " + st.Code.String()
	}
	return s
}

func ask(t testing.TB, s *Server, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	r, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func req(domain string, ds ...[]*rlv3.RateLimitDescriptor_Entry) *pb.RateLimitRequest {
	r := &pb.RateLimitRequest{Domain: domain}
	for _, e := range ds {
		r.Descriptors = append(r.Descriptors, &rlv3.RateLimitDescriptor{Entries: e})
	}
	return r
}

// TestQuotaMode: quota rules make a request OVER_LIMIT only when all of
// them are over, as envoyproxy/ratelimit's quota_mode.
func TestQuotaMode(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, `
domain: d
descriptors:
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	both := req("d", entries("q1", "x"), entries("q2", "x"))
	for i, want := range []string{"OK: OK OK", "OK: OVER_LIMIT OK", "OVER_LIMIT: OVER_LIMIT OVER_LIMIT"} {
		if got := codesOf(ask(t, s, both)); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
	}
}

func TestGlobalDryRun(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", WithDryRun(true))
	r := req("d", entries("k", "x"))
	ask(t, s, r)
	if got, want := codesOf(ask(t, s, r)), "OK: OVER_LIMIT"; got != want {
		t.Errorf("global shadow: %s, want %s (the status says the truth, the overall answer is OK)", got, want)
	}
}

// TestOverrideLimit: a descriptor that carries its own limit is counted
// with it, in a known domain only.
func TestOverrideLimit(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: d\n")
	d := &rlv3.RateLimitDescriptor{Entries: entries("k", "x"), Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}}
	r := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}}
	for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
		resp := ask(t, s, r)
		if got := codesOf(resp); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
		if got := resp.Statuses[0].CurrentLimit.GetUnit(); got != pb.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("unit %v, want HOUR", got)
		}
	}
	r.Domain = "unknown"
	if got, want := codesOf(ask(t, s, r)), "OK: OK"; got != want {
		t.Errorf("override in an unknown domain: %s, want %s", got, want)
	}
}

// TestNoRules: before any rules (rules over xDS, started before the
// management server has sent any), the server is alive but not ready, and
// a request fails as envoyproxy/ratelimit fails it: gRPC Unknown, "no rate
// limit configuration loaded", and 400 on /json.
func TestNoRules(t *testing.T) {
	t.Parallel()
	s, err := New(memorystore.New())
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := s.Ready(); ok || why != "no rules loaded" {
		t.Errorf("Ready() = %v, %q; want false, no rules loaded", ok, why)
	}
	_, err = s.ShouldRateLimit(context.Background(), req("d", entries("k", "v")))
	if got, want := status.Code(err), codes.Unknown; got != want {
		t.Errorf("ShouldRateLimit: %v, want code %v", err, want)
	}
	if got, want := status.Convert(err).Message(), "no rate limit configuration loaded"; got != want {
		t.Errorf("ShouldRateLimit: message %q, want %q", got, want)
	}
	h := s.Handler()
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/healthcheck", "", http.StatusOK},
		{"GET", "/readyz", "", http.StatusServiceUnavailable},
		{"POST", "/json", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`, http.StatusBadRequest},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
		if rec.Code != tc.want {
			t.Errorf("%s %s: %d %q, want %d", tc.method, tc.path, rec.Code, rec.Body.String(), tc.want)
		}
	}
	// An invalid request is still refused as such first, as envoy does.
	if _, err := s.ShouldRateLimit(context.Background(), req("")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an empty domain: %v, want InvalidArgument", err)
	}
}

// TestAlgorithmsThroughTheServer: a token bucket's burst and a sliding
// window show in limit_remaining.
func TestAlgorithmsThroughTheServer(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, `
domain: d
descriptors:
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
  - key: cost
    rate_limit: {unit: minute, requests_per_unit: 10, cost: 4}
`)
	var got []uint32
	for range 4 {
		got = append(got, ask(t, s, req("d", entries("tb", "x"))).Statuses[0].LimitRemaining)
	}
	if want := []uint32{2, 1, 0, 0}; !equal(got, want) {
		t.Errorf("token bucket remaining %v, want %v", got, want)
	}
	if got, want := codesOf(ask(t, s, req("d", entries("tb", "x")))), "OVER_LIMIT: OVER_LIMIT"; got != want {
		t.Errorf("token bucket past its burst: %s, want %s", got, want)
	}
	got = got[:0]
	for range 2 {
		got = append(got, ask(t, s, req("d", entries("cost", "x"))).Statuses[0].LimitRemaining)
	}
	if want := []uint32{6, 2}; !equal(got, want) {
		t.Errorf("cost 4 remaining %v, want %v", got, want)
	}
	if got, want := codesOf(ask(t, s, req("d", entries("cost", "x")))), "OVER_LIMIT: OVER_LIMIT"; got != want {
		t.Errorf("third request of cost 4 in 10: %s, want %s", got, want)
	}
}

func equal(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// BenchmarkShouldRateLimit is the service's own cost per decision: match,
// key, decide, response, metrics. On the memory store, without the network,
// with no deadline (as serve runs the memory store) and with the default one
// (as it runs Redis); and on a real Redis through a pipelined redisstore, as
// serve runs it, with a request's descriptors decided at once
// (WithParallelDescriptors) and one after another: for requests of one
// descriptor the two should cost the same. The Redis cases include the
// store's own allocations and round trips.
func BenchmarkShouldRateLimit(b *testing.B) {
	const rules = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"
	reqs := make([]*pb.RateLimitRequest, 1024)
	for i := range reqs {
		reqs[i] = req("d", entries("k", strings.Repeat("v", 8)+string(rune('a'+i%26))+string(rune('a'+i/26%26))))
	}
	run := func(b *testing.B, s *Server, parallelism int) {
		b.ReportAllocs()
		b.SetParallelism(parallelism)
		b.RunParallel(func(p *testing.PB) {
			i := 0
			for p.Next() {
				resp, err := s.ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
				if err != nil {
					b.Fatal(err)
				}
				if got, want := resp.OverallCode, pb.RateLimitResponse_OK; got != want {
					b.Fatalf("overall code %v, want %v", got, want)
				}
				i++
			}
		})
	}
	for _, bc := range []struct {
		name    string
		timeout time.Duration
	}{{"memory/no_deadline", 0}, {"memory/deadline", enforce.DefaultTimeout}} {
		b.Run(bc.name, func(b *testing.B) {
			run(b, newTestServer(b, rules, WithTimeout(bc.timeout)), 1)
		})
	}
	rdb := redistest.NewServer(b)
	for _, bc := range []struct {
		name     string
		parallel bool
	}{{"redis/parallel", true}, {"redis/serial", false}} {
		b.Run(bc.name, func(b *testing.B) {
			client, err := redisurl.NewClient(rdb.URL())
			if err != nil {
				b.Fatal(err)
			}
			defer client.Close()
			store := redisstore.New(client, redisstore.WithPrefix(testkit.KeyPrefix(b)), redisstore.WithPipeline(50*time.Microsecond, 64))
			s, err := New(store, WithParallelDescriptors(bc.parallel), WithTimeout(5*time.Second),
				WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				b.Fatal(err)
			}
			r, err := config.Parse("rules.yaml", []byte(rules))
			if err != nil {
				b.Fatal(err)
			}
			s.SetRules(r)
			// 32 goroutines per core, so that the pipeline fills as
			// under a gateway's load.
			run(b, s, 32)
		})
	}
}

// TestCounterKeyHashedApart: a key too long for the store is hashed the way
// the middleware hashes (storekey.String), into "rl#", where no literal
// key can follow: a descriptor sending the hash of another's long value as
// its own value gets a counter of its own.
func TestCounterKeyHashedApart(t *testing.T) {
	t.Parallel()
	r := &config.Rule{}
	long := strings.Repeat("x", tollgate.MaxKeyLen)
	literal := "d|path=" + long
	sum := sha256.Sum256([]byte(literal))
	h := hex.EncodeToString(sum[:])
	hashed := counterKey("d", entries("path", long), r)
	if got, want := hashed, "rl#"+h; got != want {
		t.Errorf("long key %q, want %q", got, want)
	}
	if got, want := hashed, storekey.String([]byte("rl|"+literal), len("rl|")); got != want {
		t.Errorf("long key %q, want storekey.String's %q", got, want)
	}
	for _, tc := range []struct{ domain, value string }{
		{"d", h}, {"d", "#" + h}, {"#" + h, ""}, {"", h},
	} {
		if got := counterKey(tc.domain, entries("path", tc.value), r); got == hashed || strings.HasPrefix(got, "rl#") {
			t.Errorf("literal descriptor %q/%q keyed %q, in the hashed keys' namespace", tc.domain, tc.value, got)
		}
	}
}
