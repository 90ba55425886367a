package service

import (
	"strings"
	"testing"
)

// TestAuthForwardAuthBehindNginxHeaders: an endpoint reading nginx's
// headers refuses a request that came through Caddy's or Traefik's forward
// auth (which set X-Forwarded-Uri and X-Forwarded-Method and pass the
// client's own headers through), whatever X-Original-* the client added.
func TestAuthForwardAuthBehindNginxHeaders(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: d\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	nginx, err := s.AuthHandler(HTTPRules{Domain: "d", Descriptors: []string{"path"}})
	if err != nil {
		t.Fatal(err)
	}
	forwardAuth := []string{"X-Forwarded-Uri", "/login", "X-Forwarded-Method", "GET", "X-Forwarded-For", "127.0.0.1"}
	tests := []struct {
		name string
		hdr  []string
		want int
		body string // in the answer
	}{
		{"forward auth, no X-Original-*", forwardAuth, 400, "X-Forwarded-Uri and X-Forwarded-Method"},
		{"forward auth, the client's X-Original-*", append(forwardAuth, "X-Original-URI", "/other", "X-Original-Method", "GET"), 400, "X-Forwarded-Uri and X-Forwarded-Method"},
		{"nginx, a client's X-Forwarded-Uri only", []string{"X-Original-URI", "/login", "X-Original-Method", "GET", "X-Forwarded-Uri", "/x"}, 200, ""},
		{"nginx 2nd", []string{"X-Original-URI", "/login", "X-Original-Method", "GET"}, 429, ""},
	}
	for _, tc := range tests {
		got := authRequest(nginx, "", tc.hdr...)
		if got.Code != tc.want || !strings.Contains(got.Body.String(), tc.body) {
			t.Errorf("%s: %d %q, want %d and %q", tc.name, got.Code, got.Body.String(), tc.want, tc.body)
		}
	}
}

// TestAuthHeaderHelp: the 400 for missing headers ends with how to name
// the right ones, and a request that has them is not told.
func TestAuthHeaderHelp(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, "domain: d\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	h, err := s.AuthHandler(HTTPRules{Domain: "d", Descriptors: []string{"path"}, HeaderHelp: "use --flag"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		hdr  []string
		want int
		body string
	}{
		{nil, 400, "got 0 and 0 (use --flag)\n"},
		{[]string{"X-Forwarded-Uri", "/a", "X-Forwarded-Method", "GET"}, 400, "refused (use --flag)\n"},
		{[]string{"X-Original-URI", "/%zz", "X-Original-Method", "GET"}, 400, "not a valid URI path\n"},
		{[]string{"X-Original-URI", "/a", "X-Original-Method", "GET"}, 200, ""},
	}
	for _, tc := range tests {
		got := authRequest(h, "", tc.hdr...)
		if got.Code != tc.want || !strings.HasSuffix(got.Body.String(), tc.body) {
			t.Errorf("%v: %d %q, want %d ending in %q", tc.hdr, got.Code, got.Body.String(), tc.want, tc.body)
		}
	}
}
