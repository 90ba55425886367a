package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// TestServeFailClosedRetryAfter stops Redis under a service whose rule
// fails closed: every door's 429 (gRPC's OVER_LIMIT, /json, /auth) tells
// the client when to come back — a second by default, as the middleware's
// fail-closed answers, or --fail-closed-retry-after — and a rule that
// fails open adds nothing.
func TestServeFailClosedRetryAfter(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, `domain: d
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: closed}
`)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"default", nil, "1"},
		{"flag", []string{"--fail-closed-retry-after", "2500ms"}, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startTollgate(t, "serve", append([]string{"--config", path, "--redis", rdb.URL(), "--timeout", "50ms",
				"--descriptor", "closed=remote_address"}, tc.args...)...)
			p.ask(request("d", desc("open", "warm"))) // the client connects while Redis answers
			if err := rdb.Stop(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := rdb.Start(); err != nil {
					t.Error(err)
				}
			})

			id := randomID()
			r := p.ask(request("d", desc("open", id), desc("closed", id)))
			if got, want := codesOf(r), "OVER_LIMIT: OK OVER_LIMIT"; got != want {
				t.Fatalf("gRPC: %s, want %s", got, want)
			}
			if got := headersOf(r)["Retry-After"]; got != tc.want {
				t.Errorf("gRPC: Retry-After %q, want %q (response_headers_to_add %v)", got, tc.want, headersOf(r))
			}
			if got := r.Statuses[1].GetDurationUntilReset().GetSeconds(); fmt.Sprint(got) != tc.want {
				t.Errorf("gRPC: duration_until_reset of the closed descriptor %ds, want %ss", got, tc.want)
			}
			if got := p.ask(request("d", desc("open", id))); codesOf(got) != "OK: OK" || len(got.ResponseHeadersToAdd) != 0 {
				t.Errorf("gRPC, open only: %s %v, want OK and no header fields", codesOf(got), headersOf(got))
			}

			body := `{"domain":"d","descriptors":[{"entries":[{"key":"closed","value":"` + id + `"}]}]}`
			resp, err := http.Post(p.http+"/json", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != tc.want {
				t.Errorf("/json: %d, Retry-After %q; want 429, %q", resp.StatusCode, resp.Header.Get("Retry-After"), tc.want)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", p.http+"/auth?domain=d", nil)
			req.Header.Set("X-Original-URI", "/x")
			req.Header.Set("X-Original-Method", "GET")
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != tc.want {
				t.Errorf("/auth: %d, Retry-After %q; want 429, %q", resp.StatusCode, resp.Header.Get("Retry-After"), tc.want)
			}
		})
	}
}
