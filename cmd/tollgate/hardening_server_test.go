package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// The tests below are a hostile client's view of tollgate serve: each sends
// what a client can send and checks that it buys no extra allowance, no
// memory and no false alerts.

// rawRequest sends method and target exactly as written (no client library
// cleans the target) to base, with the header lines hdr ("Name: value"),
// and returns the status code and body.
func rawRequest(t *testing.T, base, method, target string, hdr ...string) (int, string) {
	t.Helper()
	host := strings.TrimPrefix(base, "http://")
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: 0\r\n", method, target, host)
	for _, h := range hdr {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestHardenAuthPathNormalized: behind the shipped nginx config, spelling
// a path differently (percent-encoded unreserved characters, dot segments,
// repeated slashes) spends the same counter as the plain path.
func TestHardenAuthPathNormalized(t *testing.T) {
	t.Parallel()
	app := upstreamApp(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, `domain: edge
descriptors:
  - key: api_key
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: hour, requests_per_unit: 5}
`)
	tg := startTollgate(t, "serve", "--config", rules)
	base := startNginx(t, tg.http, app.URL)
	key := "X-API-Key: k-" + randomID()
	for i := range 5 {
		if code, body := rawRequest(t, base, "POST", "/login", key); code != 200 || body != "hello /login" {
			t.Fatalf("POST /login %d: %d %q, want the app's 200", i+1, code, body)
		}
	}
	if code, _ := rawRequest(t, base, "POST", "/login", key); code != 429 {
		t.Fatalf("6th POST /login: %d, want 429", code)
	}
	for _, target := range []string{"/%6Cogin", "/l%6Fgin", "/%6c%6F%67%69%6e", "//login", "/./login", "/x/../login", "/%2E/login", "///./x/..//login", "/login?x=1"} {
		if code, body := rawRequest(t, base, "POST", target, key); code != 429 {
			t.Errorf("POST %s after 5 of /login: %d %q, want 429 (the same path)", target, code, body)
		}
	}
	// nginx sets X-Original-URI itself, replacing the client's.
	if code, body := rawRequest(t, base, "POST", "/login", key, "X-Original-URI: /fresh"); code != 429 {
		t.Errorf("POST /login with the client's own X-Original-URI: /fresh: %d %q, want 429", code, body)
	}
	// Other paths have no limit.
	if code, _ := rawRequest(t, base, "POST", "/login2", key); code != 200 {
		t.Errorf("POST /login2: %d, want 200", code)
	}
}

// authGet asks tollgate's /auth directly, as a forward-auth proxy does.
func authGet(t *testing.T, base, query string, hdr ...string) (int, string) {
	t.Helper()
	return rawRequest(t, base, "GET", "/auth?"+query, hdr...)
}

// TestHardenAuthInvalidPath: /auth refuses a path it cannot normalize with
// 400, and answers the same path spelt differently alike.
func TestHardenAuthInvalidPath(t *testing.T) {
	t.Parallel()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, "domain: edge\ndescriptors:\n  - key: path\n    value: /a/b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	tg := startTollgate(t, "serve", "--config", rules)
	q := "domain=edge&descriptor=path"
	for _, uri := range []string{"/a/b", "/a%2Fb"} {
		if code, body := authGet(t, tg.http, q, "X-Original-URI: "+uri, "X-Original-Method: GET"); code != 200 {
			t.Fatalf("%s: %d %q, want 200", uri, code, body)
		}
	}
	for _, uri := range []string{"/a/./b", "http://example.com/a//b?q", "/a/c/%2e%2E/b"} {
		if code, body := authGet(t, tg.http, q, "X-Original-URI: "+uri, "X-Original-Method: GET"); code != 429 {
			t.Errorf("%s after 2 of /a/b: %d %q, want 429", uri, code, body)
		}
	}
	for _, uri := range []string{"/a%zzb", "/a%2", "/a%", "*", "login"} {
		if code, body := authGet(t, tg.http, q, "X-Original-URI: "+uri, "X-Original-Method: GET"); code != 400 {
			t.Errorf("%s: %d %q, want 400", uri, code, body)
		}
	}
	if got := tg.metric(`tollgate_serve_requests_total{api="nginx",code="invalid"}`); got != 5 {
		t.Errorf("invalid nginx requests = %v, want 5", got)
	}
}

// TestHardenAuthHeaderFromConfig: the header carrying the original request
// is the configured one only; a client's own X-Original-URI behind a
// forward-auth proxy that passes it through buys nothing.
func TestHardenAuthHeaderFromConfig(t *testing.T) {
	t.Parallel()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, "domain: edge\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
	q := "domain=edge&descriptor=path"

	t.Run("nginx default", func(t *testing.T) {
		t.Parallel()
		tg := startTollgate(t, "serve", "--config", rules)
		// Traefik's and Caddy's headers are not read by default: without
		// the configured header there is no request to decide on.
		if code, body := authGet(t, tg.http, q, "X-Forwarded-Uri: /login", "X-Forwarded-Method: POST"); code != 400 {
			t.Errorf("X-Forwarded-Uri only: %d %q, want 400", code, body)
		}
		if code, body := authGet(t, tg.http, q); code != 400 {
			t.Errorf("no header: %d %q, want 400", code, body)
		}
		if code, body := authGet(t, tg.http, q, "X-Original-URI: /login"); code != 400 {
			t.Errorf("X-Original-URI without X-Original-Method: %d %q, want 400", code, body)
		}
		for i := range 3 {
			if code, body := authGet(t, tg.http, q, "X-Original-URI: /login", "X-Original-Method: POST"); code != 200 {
				t.Fatalf("%d: %d %q, want 200", i+1, code, body)
			}
		}
		if code, _ := authGet(t, tg.http, q, "X-Original-URI: /login", "X-Original-Method: POST", "X-Forwarded-Uri: /other"); code != 429 {
			t.Errorf("4th with X-Forwarded-Uri: /other added: %d, want 429", code)
		}
	})

	t.Run("traefik", func(t *testing.T) {
		t.Parallel()
		tg := startTollgate(t, "serve", "--config", rules, "--auth-uri-header", "X-Forwarded-Uri", "--auth-method-header", "X-Forwarded-Method")
		for i := range 3 {
			if code, body := authGet(t, tg.http, q, "X-Forwarded-Uri: /login", "X-Forwarded-Method: POST"); code != 200 {
				t.Fatalf("%d: %d %q, want 200", i+1, code, body)
			}
		}
		// Traefik sets X-Forwarded-Uri and passes the client's own
		// X-Original-URI through: the latter must change nothing.
		if code, _ := authGet(t, tg.http, q, "X-Forwarded-Uri: /login", "X-Forwarded-Method: POST", "X-Original-URI: /fresh", "X-Original-Method: GET"); code != 429 {
			t.Errorf("4th with the client's X-Original-URI: /fresh: %d, want 429", code)
		}
		if code, _ := authGet(t, tg.http, q, "X-Original-URI: /login", "X-Original-Method: POST"); code != 400 {
			t.Errorf("X-Original-URI only: %d, want 400", code)
		}
	})
}

// many returns n descriptors (k, 0), (k, 1), ...
func many(n int) []*rlv3.RateLimitDescriptor {
	ds := make([]*rlv3.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = desc("k", strconv.Itoa(i))
	}
	return ds
}

func askErr(t *testing.T, p *proc, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return p.rls.ShouldRateLimit(ctx, req)
}

const boundRules = `domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_window_log}
`

// TestHardenRequestBounds: one request's descriptors, entries and bytes
// are bounded, over gRPC and /json, and refused as invalid past the bound.
func TestHardenRequestBounds(t *testing.T) {
	t.Parallel()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, boundRules)

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		p := startTollgate(t, "serve", "--config", rules)
		r, err := askErr(t, p, request("d", many(64)...))
		if err != nil {
			t.Fatalf("64 descriptors: %v, want an answer", err)
		}
		if got, want := strings.Count(headersOf(r)["RateLimit-Policy"], `"d.k"`), 64; got != want {
			t.Errorf("64 descriptors: %d policies in RateLimit-Policy, want %d", got, want)
		}
		if _, err := askErr(t, p, request("d", many(65)...)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("65 descriptors: %v, want InvalidArgument", err)
		}
		if _, err := askErr(t, p, request("d", many(10000)...)); status.Code(err) != codes.InvalidArgument && status.Code(err) != codes.ResourceExhausted {
			t.Errorf("10,000 descriptors: %v, want InvalidArgument or ResourceExhausted", err)
		}
		long := desc("k", "x")
		for i := range 16 {
			long.Entries = append(long.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "e" + strconv.Itoa(i), Value: "v"})
		}
		if _, err := askErr(t, p, request("d", long)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("17 entries: %v, want InvalidArgument", err)
		}
		if got := p.metric(`tollgate_serve_invalid_total{reason="too_many_descriptors"}`); got < 1 {
			t.Errorf("invalid{too_many_descriptors} = %v, want ≥ 1", got)
		}
		if got := p.metric(`tollgate_serve_requests_total{api="grpc",code="invalid"}`); got < 2 {
			t.Errorf("grpc invalid requests = %v, want ≥ 2", got)
		}

		// /json: 65 descriptors are a 400, a body over 64 KiB a 413.
		var b strings.Builder
		b.WriteString(`{"domain":"d","descriptors":[`)
		for i := range 65 {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"entries":[{"key":"k","value":"%d"}]}`, i)
		}
		b.WriteString("]}")
		if code, out := postJSON(t, p.http+"/json", b.String()); code != http.StatusBadRequest {
			t.Errorf("/json 65 descriptors: %d %.100s, want 400", code, out)
		}
		big := `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("x", 70<<10) + `"}]}]}`
		if code, out := postJSON(t, p.http+"/json", big); code != http.StatusRequestEntityTooLarge {
			t.Errorf("/json body of 70 KiB: %d %.100s, want 413", code, out)
		}
		// gRPC: a message over the same bound is refused by gRPC itself.
		if _, err := askErr(t, p, request("d", desc("k", strings.Repeat("x", 70<<10)))); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("gRPC message of 70 KiB: %v, want ResourceExhausted", err)
		}

		// /auth: as many descriptor specs as descriptors, as many entries.
		q := "domain=d" + strings.Repeat("&descriptor=method", 65)
		if code, body := authGet(t, p.http, q, "X-Original-URI: /", "X-Original-Method: GET"); code != 400 {
			t.Errorf("/auth with 65 descriptors: %d %q, want 400", code, body)
		}
		q = "domain=d&descriptor=" + url.QueryEscape(strings.TrimSuffix(strings.Repeat("method,", 17), ","))
		if code, body := authGet(t, p.http, q, "X-Original-URI: /", "X-Original-Method: GET"); code != 400 {
			t.Errorf("/auth with 17 entries: %d %q, want 400", code, body)
		}
	})

	t.Run("flags", func(t *testing.T) {
		t.Parallel()
		p := startTollgate(t, "serve", "--config", rules, "--max-descriptors", "2", "--max-entries", "1", "--max-hits", "5", "--max-request-bytes", "1024")
		if _, err := askErr(t, p, request("d", many(2)...)); err != nil {
			t.Errorf("2 descriptors: %v, want an answer", err)
		}
		if _, err := askErr(t, p, request("d", many(3)...)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("3 descriptors: %v, want InvalidArgument", err)
		}
		if _, err := askErr(t, p, request("d", desc("k", "x", "y", "z"))); status.Code(err) != codes.InvalidArgument {
			t.Errorf("2 entries: %v, want InvalidArgument", err)
		}
		if _, err := askErr(t, p, &pb.RateLimitRequest{Domain: "d", HitsAddend: 6, Descriptors: many(1)}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("6 hits: %v, want InvalidArgument", err)
		}
		if code, _ := postJSON(t, p.http+"/json", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"`+strings.Repeat("x", 1100)+`"}]}]}`); code != http.StatusRequestEntityTooLarge {
			t.Errorf("/json body over 1024 bytes: %d, want 413", code)
		}
		if _, err := askErr(t, p, request("d", desc("k", strings.Repeat("x", 1100)))); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("gRPC message over 1024 bytes: %v, want ResourceExhausted", err)
		}
	})
}

// TestHardenHits: a caller's hits_addend is bounded before the store sees
// it, and a cost the rule can never admit is invalid input — not a store
// failure, not a failure-mode answer.
func TestHardenHits(t *testing.T) {
	t.Parallel()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, boundRules)
	stores(t, func(t *testing.T, storeArgs []string) {
		p := startTollgate(t, "serve", append([]string{"--config", rules}, storeArgs...)...)
		id := randomID()
		storeCalls := func() float64 { return p.metric("tollgate_serve_store_duration_seconds_count") }
		before := storeCalls()
		huge := desc("log", id)
		huge.HitsAddend = wrapperspb.UInt64(100000)
		for _, tc := range []struct {
			name string
			req  *pb.RateLimitRequest
		}{
			{"100,000 hits on a sliding window log", request("d", huge)},
			{"request-level 50,000 hits", &pb.RateLimitRequest{Domain: "d", HitsAddend: 50000, Descriptors: []*rlv3.RateLimitDescriptor{desc("log", id)}}},
		} {
			if r, err := askErr(t, p, tc.req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: %v %v, want InvalidArgument", tc.name, r, err)
			}
		}
		// A cost the rule can never admit is over the limit, as envoy
		// answers it (an error would let a gateway that fails open pass
		// it), and no store is asked.
		for _, tc := range []struct {
			name string
			req  *pb.RateLimitRequest
			want string
		}{
			{"4 hits on 3 per minute", &pb.RateLimitRequest{Domain: "d", HitsAddend: 4, Descriptors: []*rlv3.RateLimitDescriptor{desc("small", id)}}, "OVER_LIMIT: OVER_LIMIT"},
		} {
			if r, err := askErr(t, p, tc.req); err != nil || codesOf(r) != tc.want {
				t.Errorf("%s: %v %v, want %s", tc.name, r, err, tc.want)
			}
		}
		if got := storeCalls(); got != before {
			t.Errorf("store calls went from %v to %v, want none for requests no rule can admit", before, got)
		}
		// Nothing was spent: 3 hits still fit.
		r, err := askErr(t, p, &pb.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("small", id)}})
		if err != nil || codesOf(r) != "OK: OK" {
			t.Errorf("3 hits on 3 per minute: %v %v, want OK: OK", r, err)
		}
		// Up to the default bound of 1,000 hits is fine.
		ok := desc("log", id)
		ok.HitsAddend = wrapperspb.UInt64(1000)
		if r, err := askErr(t, p, request("d", ok)); err != nil || codesOf(r) != "OK: OK" {
			t.Errorf("1,000 hits: %v %v, want OK: OK", r, err)
		}
		if got := p.metric(`tollgate_serve_store_errors_total{reason="error"}`) + p.metric(`tollgate_serve_store_errors_total{reason="timeout"}`); got != 0 {
			t.Errorf("store errors = %v, want 0", got)
		}
		if got := p.metric(`tollgate_serve_invalid_total{reason="hits"}`); got != 2 {
			t.Errorf("invalid{hits} = %v, want 2", got)
		}
	})
}

// TestHardenInvalidOverride: a descriptor's own limit that no store can
// count with is invalid input, answered and counted as such.
func TestHardenInvalidOverride(t *testing.T) {
	t.Parallel()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, boundRules)
	stores(t, func(t *testing.T, storeArgs []string) {
		p := startTollgate(t, "serve", append([]string{"--config", rules}, storeArgs...)...)
		d := desc("k", randomID())
		// 10 per 1,000 days: longer than any store counts.
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_DAY, UnitMultiplier: wrapperspb.UInt32(1000)}
		if r, err := askErr(t, p, request("d", d)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("override of 10 per 1,000 days: %v %v, want InvalidArgument", r, err)
		}
		body := `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"}],"limit":{"requestsPerUnit":10,"unit":"DAY","unitMultiplier":1000}}]}`
		if code, out := postJSON(t, p.http+"/json", body); code != http.StatusBadRequest {
			t.Errorf("/json override of 10 per 1,000 days: %d %s, want 400", code, out)
		}
		if got := p.metric(`tollgate_serve_store_errors_total{reason="error"}`); got != 0 {
			t.Errorf("store errors = %v, want 0", got)
		}
		if got := p.metric(`tollgate_serve_invalid_total{reason="override"}`); got != 2 {
			t.Errorf("invalid{override} = %v, want 2", got)
		}
		if strings.Contains(p.log.String(), "store failed") {
			t.Errorf("an invalid override was logged as a store failure:\n%s", p.log.String())
		}
	})
}

// TestHardenTimeoutsPerRequest: when Redis stops answering, one request of
// many descriptors counts one store timeout, not one per descriptor, and
// every descriptor is answered by failure mode within the deadline. On
// Redis the descriptors' calls go out at once (one pipeline); a descriptor
// whose call would start after the deadline is answered without one, and
// counted apart.
func TestHardenTimeoutsPerRequest(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, boundRules)
	p := startTollgate(t, "serve", "--config", rules, "--redis", rdb.URL(), "--timeout", "50ms")
	if err := rdb.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Resume() })
	id := randomID()
	ds := make([]*rlv3.RateLimitDescriptor, 40)
	for i := range ds {
		ds[i] = desc("k", id+strconv.Itoa(i))
	}
	r, err := askErr(t, p, request("d", ds...))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.OverallCode, pb.RateLimitResponse_OK; got != want {
		t.Errorf("overall %v, want %v (fail open)", got, want)
	}
	if got := p.metric(`tollgate_serve_store_errors_total{reason="timeout"}`); got != 1 {
		t.Errorf("store timeouts = %v, want 1 for one request", got)
	}
	made, skipped := p.metric(`tollgate_serve_store_duration_seconds_count`), p.metric(`tollgate_serve_store_skipped_total`)
	if made+skipped != 40 {
		t.Errorf("store calls made %v + skipped %v, want 40", made, skipped)
	}
	if got := p.metric(`tollgate_serve_decisions_total{domain="d",outcome="fail_open",rule="d.k"}`); got != 40 {
		t.Errorf("fail_open decisions = %v, want 40", got)
	}
}
