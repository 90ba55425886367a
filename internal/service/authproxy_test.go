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
