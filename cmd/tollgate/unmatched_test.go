package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestServeLogsUnmatched: a rule key spelt wrong, and a wrong domain= in the
// auth endpoint's URL (as in an nginx location), turn no limit on; the
// service says so at WARN, with the domain and the keys, and without the
// values (a client address here, an API key elsewhere).
func TestServeLogsUnmatched(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: edge\ndescriptors:\n  - key: remote_adress\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	p := startTollgate(t, "serve", "--config", path, "--descriptor", "remote_address")

	r := p.ask(request("edge", desc("remote_address", "203.0.113.7")))
	if got, want := codesOf(r), "OK: OK"; got != want {
		t.Errorf("gRPC: %s, want %s (no rule matches)", got, want)
	}
	p.log.waitFor(t, regexp.MustCompile(`level=WARN msg="no rule matches the descriptor: answered OK without a limit" api=grpc domain=edge keys=remote_address`), 5*time.Second)

	code, _ := authGet(t, p.http, "domain=edgee", "X-Original-URI: /x", "X-Original-Method: GET")
	if code != 200 {
		t.Errorf("/auth with an unknown domain: %d, want 200", code)
	}
	p.log.waitFor(t, regexp.MustCompile(`level=WARN msg="unknown domain: descriptor answered OK without a limit" api=nginx domain=edgee keys=remote_address domains=\[edge\]`), 5*time.Second)
	for _, line := range strings.Split(p.log.String(), "\n") {
		if strings.Contains(line, "level=WARN") && (strings.Contains(line, "203.0.113.7") || strings.Contains(line, "127.0.0.1")) {
			t.Errorf("a descriptor value was logged: %s", line)
		}
	}
}
