package main

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// debugListening matches the line that says where the debug listener is.
var debugListening = regexp.MustCompile(`msg="debug listening" addr=(\S+)`)

// TestServeRLConfig reads the rules in force from /rlconfig on the debug
// listener, in envoyproxy/ratelimit's format, before and after a reload.
func TestServeRLConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
`)
	p := startTollgate(t, "serve", "--config", dir, "--debug", "127.0.0.1:0")
	addr := p.log.waitFor(t, debugListening, 10*time.Second)[1]
	get := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/rlconfig")
		if err != nil {
			t.Fatalf("GET /rlconfig: %v", err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	code, body := get()
	if got, want := code, http.StatusOK; got != want {
		t.Fatalf("GET /rlconfig: status %d, want %d", got, want)
	}
	want := "edge.remote_address: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false\n" +
		"edge.remote_address_50.0.0.5: unit=SECOND requests_per_unit=0, shadow_mode: true, quota_mode: false\n"
	if got := body; got != want {
		t.Fatalf("GET /rlconfig:\n%s\nwant:\n%s", got, want)
	}

	writeFile(t, path, rulesFile(7))
	want = "reload.k: unit=MINUTE requests_per_unit=7, shadow_mode: false, quota_mode: false\n"
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body = get()
		if body == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /rlconfig 10s after a reload:\n%s\nwant:\n%s", body, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
