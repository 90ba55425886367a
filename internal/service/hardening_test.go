package service

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestNormalizePath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
	}{
		{"/login", "/login"},
		{"/%6Cogin", "/login"},
		{"/l%6fgin", "/login"},
		{"/%6c%6F%67%69%6e", "/login"},
		{"//login", "/login"},
		{"/./login", "/login"},
		{"/a/b/../../login", "/login"},
		{"/../../login", "/login"},
		{"/%2e%2E/login", "/login"},
		{"/a%2Fb", "/a/b"},
		{"/a%2f..%2fb", "/b"},
		{"/a/b/", "/a/b/"},
		{"/a/b/.", "/a/b/"},
		{"/a/b/..", "/a/"},
		{"/", "/"},
		{"/..", "/"},
		{"//", "/"},
		{"/login?x=1", "/login"},
		{"/login#top", "/login"},
		{"/a%3fb", "/a%3Fb"},
		{"/a%25b", "/a%25b"},
		{"/a%252Fb", "/a%252Fb"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/Login", "/Login"},
		{"/a;b", "/a;b"},
		{"/.hidden/x", "/.hidden/x"},
		{"/a.b/c..d", "/a.b/c..d"},
		{"http://example.com/a//b?q", "/a/b"},
		{"HTTPS://example.com", "/"},
		{"http://example.com/./%6Cogin", "/login"},
	}
	for _, tc := range tests {
		got, err := NormalizePath(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("NormalizePath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "login", "*", "/a%", "/a%2", "/a%zz", "/a%g0", "ftp://x/a", "?x"} {
		if got, err := NormalizePath(bad); err == nil {
			t.Errorf("NormalizePath(%q) = %q, nil; want an error", bad, got)
		}
	}
}

// checkNormalized reports what is wrong with p, a result of NormalizePath,
// or "".
func checkNormalized(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return "does not start with /"
	case strings.Contains(p, "//"):
		return "has //"
	case strings.ContainsAny(p, "?#"):
		return "has a query or fragment"
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "." || seg == ".." {
			return "has a dot segment"
		}
	}
	for i := 0; i < len(p); i++ {
		if p[i] != '%' {
			continue
		}
		if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			return "has an invalid percent-encoding"
		}
		if v := unhex(p[i+1])<<4 | unhex(p[i+2]); v == '/' || isUnreserved(v) {
			return "has an encoded unreserved character or slash"
		}
		if p[i+1] != upperHex(p[i+1]) || p[i+2] != upperHex(p[i+2]) {
			return "has a lower-case percent-encoding"
		}
	}
	return ""
}

// FuzzNormalizePath: whatever the target, NormalizePath refuses it or
// returns a path in normal form that it maps to itself.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/login", "/%6Cogin", "//./a/../b/", "/a%2F%2e%2E%2fb", "http://h/x?y", "/%zz", "/caf%c3%a9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		p, err := NormalizePath(target)
		if err != nil {
			return
		}
		if why := checkNormalized(p); why != "" {
			t.Fatalf("NormalizePath(%q) = %q, which %s", target, p, why)
		}
		if again, err := NormalizePath(p); err != nil || again != p {
			t.Fatalf("NormalizePath(%q) = %q, but NormalizePath(%q) = %q, %v", target, p, p, again, err)
		}
	})
}

const hardeningRules = `domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: costly
    rate_limit: {unit: minute, requests_per_unit: 10, cost: 4}
`

func many(n int) []*rlv3.RateLimitDescriptor {
	ds := make([]*rlv3.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = &rlv3.RateLimitDescriptor{Entries: entries("k", "x")}
	}
	return ds
}

func withHits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func TestRequestBounds(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, hardeningRules, WithMaxDescriptors(4), WithMaxEntries(2), WithMaxHits(50))
	desc := func(pairs ...string) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{Entries: entries(pairs...)}
	}
	tests := []struct {
		name   string
		req    *pb.RateLimitRequest
		reason string // "" when the request is answered
	}{
		{"4 descriptors", &pb.RateLimitRequest{Domain: "d", Descriptors: many(4)}, ""},
		{"5 descriptors", &pb.RateLimitRequest{Domain: "d", Descriptors: many(5)}, "too_many_descriptors"},
		{"2 entries", &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "x", "y", "z")}}, ""},
		{"3 entries", &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "x", "y", "z", "w", "v")}}, "too_many_entries"},
		{"request hits 50", &pb.RateLimitRequest{Domain: "d", HitsAddend: 50, Descriptors: many(1)}, ""},
		{"request hits 51", &pb.RateLimitRequest{Domain: "d", HitsAddend: 51, Descriptors: many(1)}, "hits"},
		{"descriptor hits 51", &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{withHits(desc("k", "y"), 51)}}, "hits"},
		{"descriptor hits 2^64-1", &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{withHits(desc("k", "y"), 1<<64-1)}}, "hits"},
		{"3 hits of 3", &pb.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("small", "a")}}, ""},
		{"4 hits of 3", &pb.RateLimitRequest{Domain: "d", HitsAddend: 4, Descriptors: []*rlv3.RateLimitDescriptor{desc("small", "b")}}, ""}, // over the limit, not invalid
		{"2 hits of cost 4 on 10", &pb.RateLimitRequest{Domain: "d", HitsAddend: 2, Descriptors: []*rlv3.RateLimitDescriptor{desc("costly", "a")}}, ""},
		{"3 hits of cost 4 on 10", &pb.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("costly", "b")}}, ""}, // over the limit, not invalid
		{"4 hits of 3, looked at only", &pb.RateLimitRequest{Domain: "d", HitsAddend: 4, Descriptors: []*rlv3.RateLimitDescriptor{withHits(desc("small", "c"), 0)}}, ""},
		{"unknown domain, many hits", &pb.RateLimitRequest{Domain: "nope", HitsAddend: 40, Descriptors: []*rlv3.RateLimitDescriptor{desc("small", "d")}}, ""},
		{"no domain", &pb.RateLimitRequest{Descriptors: many(1)}, "request"},
		{"override of 10 per 1,000 days", &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: entries("k", "o"),
			Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: 4, UnitMultiplier: wrapperspb.UInt32(1000)}}}}, "override"},
		{"override without a unit", &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: entries("k", "o"),
			Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10}}}}, "override"},
		{"override of 0 per hour denies", &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: entries("k", "o"),
			Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: 3}}}}, ""},
		{"override of 2 per hour, 3 hits", &pb.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{{Entries: entries("k", "o"),
			Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 3}}}}, ""}, // over the limit, not invalid
	}
	for _, tc := range tests {
		counts := map[string]float64{}
		for i, name := range invalidNames {
			counts[name] = testutil.ToFloat64(s.m.invalid[i])
		}
		_, err := s.ShouldRateLimit(context.Background(), tc.req)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v, want an answer", tc.name, err)
			}
			continue
		}
		if got, want := status.Code(err), codes.InvalidArgument; got != want {
			t.Errorf("%s: %v, want %v", tc.name, err, want)
		}
		for i, name := range invalidNames {
			got, want := testutil.ToFloat64(s.m.invalid[i])-counts[name], 0.0
			if name == tc.reason {
				want = 1
			}
			if got != want {
				t.Errorf("%s: invalid{%s} went up by %v, want %v", tc.name, name, got, want)
			}
		}
	}
	if got := testutil.ToFloat64(s.m.storeErrors[0]) + testutil.ToFloat64(s.m.storeErrors[1]); got != 0 {
		t.Errorf("store errors = %v, want 0", got)
	}
}

func TestSpecCacheBounded(t *testing.T) {
	t.Parallel()
	var c specCache
	big := strings.TrimSuffix(strings.Repeat("header:X-A,", 15), ",") + "," + "header:" + strings.Repeat("x", 100000)
	for i := range 20 {
		raw := []string{big + strings.Repeat("y", i)}
		specs, err := c.get(raw, 64, 16)
		if err != nil || len(specs) != 1 || len(specs[0]) != 16 {
			t.Fatalf("get: %d specs, %v; want 1 of 16 entries", len(specs), err)
		}
	}
	if got := len(c.m); got != 0 {
		t.Errorf("%d specs of 100 KB cached, want none", got)
	}
	for i := range maxCachedSpecs + 10 {
		if _, err := c.get([]string{"remote_address", "header:X-" + strings.Repeat("a", i%300) + "b"}, 64, 16); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := len(c.m), maxCachedSpecs; got > want {
		t.Errorf("%d specs cached, want at most %d", got, want)
	}
	size := 0
	for k := range c.m {
		size += len(k)
	}
	if size > maxCachedSpecs*maxCachedSpec {
		t.Errorf("%d bytes of specs cached, want at most %d", size, maxCachedSpecs*maxCachedSpec)
	}
	if _, err := c.get([]string{strings.TrimSuffix(strings.Repeat("method,", 17), ",")}, 64, 16); err == nil {
		t.Errorf("a spec of 17 entries: no error")
	}
	if _, err := c.get(strings.Split(strings.Repeat("method ", 65), " ")[:65], 64, 16); err == nil {
		t.Errorf("65 specs: no error")
	}
}

// authRequest asks h as a proxy would, with the given headers.
func authRequest(h http.Handler, query string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/auth", nil)
	r.URL.RawQuery = query
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestAuthHeaders(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: d\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	nginx, err := s.AuthHandler(HTTPRules{Domain: "d", Descriptors: []string{"path"}})
	if err != nil {
		t.Fatal(err)
	}
	traefik, err := s.AuthHandler(HTTPRules{Domain: "d", Descriptors: []string{"path"}, URIHeader: "x-forwarded-uri", MethodHeader: "X-Forwarded-Method"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		h    http.Handler
		hdr  []string
		want int
	}{
		{"nginx without headers", nginx, nil, 400},
		{"nginx with Traefik's", nginx, []string{"X-Forwarded-Uri", "/login", "X-Forwarded-Method", "GET"}, 400},
		{"nginx without a method", nginx, []string{"X-Original-URI", "/login"}, 400},
		{"nginx with two URIs", nginx, []string{"X-Original-URI", "/a", "X-Original-URI", "/login", "X-Original-Method", "GET"}, 400},
		{"nginx bad path", nginx, []string{"X-Original-URI", "/%zz", "X-Original-Method", "GET"}, 400},
		{"nginx 1st", nginx, []string{"X-Original-URI", "/login", "X-Original-Method", "GET"}, 200},
		{"nginx 2nd", nginx, []string{"X-Original-URI", "/%6Cogin", "X-Original-Method", "GET"}, 429},
		{"traefik with the client's X-Original-URI", traefik, []string{"X-Forwarded-Uri", "//login", "X-Forwarded-Method", "GET", "X-Original-URI", "/other"}, 429},
		{"traefik with nginx's", traefik, []string{"X-Original-URI", "/other", "X-Original-Method", "GET"}, 400},
		{"traefik other path", traefik, []string{"X-Forwarded-Uri", "/other", "X-Forwarded-Method", "GET"}, 200},
	}
	for _, tc := range tests {
		if got := authRequest(tc.h, "", tc.hdr...); got.Code != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, got.Code, got.Body.String(), tc.want)
		}
	}
}

func TestJSONBodyBound(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, hardeningRules, WithMaxRequestBytes(200))
	h := s.Handler()
	for _, tc := range []struct {
		body string
		want int
	}{
		{`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"}]}]}`, 200},
		{`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("x", 200) + `"}]}]}`, 413},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(tc.body)))
		if w.Code != tc.want {
			t.Errorf("body of %d bytes: %d, want %d", len(tc.body), w.Code, tc.want)
		}
	}
}

// FuzzJSON: whatever the /json body, the answer is one of the API's, and a
// 200 or 429 is a response with a status per descriptor.
func FuzzJSON(f *testing.F) {
	for _, s := range []string{
		`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"}]}]}`,
		`{"domain":"d","hitsAddend":4,"descriptors":[{"entries":[{"key":"small","value":"x"}]}]}`,
		`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"}],"limit":{"requestsPerUnit":10,"unit":"DAY","unitMultiplier":1000}}]}`,
		`{"domain":"d","descriptors":[{"entries":[{"key":"costly","value":"x"}],"hitsAddend":"2"}]}`,
		`{"domain":"d"}`, `{`, `[]`, `{"domain":"d","descriptors":[{},{},{}]}`,
	} {
		f.Add([]byte(s))
	}
	s := newTestServer(f, hardeningRules, WithMaxRequestBytes(4096))
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/json", bytes.NewReader(body)))
		switch w.Code {
		case 200, 429:
			if !strings.Contains(w.Body.String(), `"overallCode"`) {
				t.Fatalf("%d with body %q", w.Code, w.Body.String())
			}
		case 400, 413:
		default:
			t.Fatalf("POST /json %q: %d %q", body, w.Code, w.Body.String())
		}
	})
}

// FuzzAuthQuery: whatever the query and the original URI, the auth
// endpoint answers 200, 400 or the deny status, and the specs it caches
// stay within their bound.
func FuzzAuthQuery(f *testing.F) {
	for _, s := range [][2]string{
		{"domain=d&descriptor=path", "/login"},
		{"descriptor=remote_address&descriptor=api_key=header:X-API-Key,path&deny_status=403", "/%6Cogin?x"},
		{"descriptor=method,path,header:X-A", "//./a/../b"},
		{"descriptor=nope", "/"},
		{"deny_status=999", "/"},
		{"descriptor=a=,b", "/%zz"},
	} {
		f.Add(s[0], s[1])
	}
	s := newTestServer(f, "domain: d\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n")
	h, err := s.AuthHandler(HTTPRules{Domain: "d"})
	if err != nil {
		f.Fatal(err)
	}
	var c specCache
	f.Fuzz(func(t *testing.T, query, uri string) {
		w := authRequest(h, query, "X-Original-URI", uri, "X-Original-Method", "GET", "X-A", "a")
		if c := w.Code; c != 200 && (c < 400 || c > 599) {
			t.Fatalf("query %q uri %q: %d", query, uri, c)
		}
		// The spec parser and its cache on their own.
		q, err := url.ParseQuery(query)
		if err != nil || len(q["descriptor"]) == 0 {
			return
		}
		specs, err := c.get(q["descriptor"], 8, 4)
		if err != nil {
			return
		}
		for _, spec := range specs {
			if len(spec) == 0 || len(spec) > 4 {
				t.Fatalf("descriptor=%q: a spec of %d entries", q["descriptor"], len(spec))
			}
			for _, e := range spec {
				if e.key == "" {
					t.Fatalf("descriptor=%q: an entry without a key", q["descriptor"])
				}
			}
		}
		size := 0
		for k := range c.m {
			size += len(k)
		}
		if len(c.m) > maxCachedSpecs || size > maxCachedSpecs*maxCachedSpec {
			t.Fatalf("the spec cache holds %d specs, %d bytes", len(c.m), size)
		}
	})
}

// TestAuthConcurrent: requests to the auth endpoint share nothing but the
// spec cache (run with -race).
func TestAuthConcurrent(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: d\ndescriptors:\n  - key: method\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n")
	h, err := s.AuthHandler(HTTPRules{Domain: "d"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	for i := range 4 {
		go func() {
			code := 0
			for j := range 50 {
				q := "descriptor=method&deny_status=403"
				if (i+j)%2 == 0 {
					q = "descriptor=nope"
				}
				if w := authRequest(h, q, "X-Original-URI", "/", "X-Original-Method", "GET"); w.Code != 200 && w.Code != 400 {
					code = w.Code
				}
			}
			done <- code
		}()
	}
	for range 4 {
		if code := <-done; code != 0 {
			t.Errorf("an answer of %d, want 200 or 400", code)
		}
	}
}
