package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestServeAdmin looks at and resets a counter through the admin API of
// the binary, on memory and Redis, with the admin CLI: where the counter
// stands, its penalty, a reset that lets the tenant in again, logged with
// the token's name and never the tenant's value; and a call without a
// valid token refused.
func TestServeAdmin(t *testing.T) {
	t.Parallel()
	bin := tollgateBinary(t)
	stores(t, func(t *testing.T, storeArgs []string) {
		dir := t.TempDir()
		rules := filepath.Join(dir, "rules.yaml")
		tokens := filepath.Join(dir, "tokens")
		const token = "s3cr3t-t0ken-of-support-desk"
		write(t, rules, "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: hour\n      requests_per_unit: 3\n      penalty: {for: 1h}\n")
		write(t, tokens, "# who: token\nsupport "+token+"\n")
		p := startTollgate(t, "serve", append([]string{"--config", rules, "--admin", "127.0.0.1:0", "--admin-token-file", tokens}, storeArgs...)...)
		addr := "http://" + p.log.waitFor(t, regexp.MustCompile(`msg="admin API listening" addr=(\S+)`), 5*time.Second)[1]
		tenant := "acme-" + randomID()
		for range 4 { // 3 in, the 4th denied: the penalty starts
			p.ask(request("api", desc("tenant", tenant)))
		}
		admin := func(args ...string) (map[string]any, int) {
			t.Helper()
			cmd := exec.Command(bin, append([]string{"admin"}, append(args, "--addr", addr, "--token-file", tokens, "--domain", "api", "--entry", "tenant="+tenant)...)...)
			out, _ := cmd.Output()
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("tollgate admin %v: %q: %v", args, out, err)
			}
			return m, cmd.ProcessState.ExitCode()
		}
		got, code := admin("counter")
		if code != 0 || got["rule"] != "api.tenant" || got["remaining"] != 0.0 || got["limit"] == nil {
			t.Errorf("counter: exit %d, %v; want api.tenant with 0 remaining", code, got)
		}
		if ends, ok := got["penalty_ends_in_seconds"].(float64); !ok || ends < 3500 || ends > 3600 {
			t.Errorf("counter: penalty_ends_in_seconds %v, want about an hour", got["penalty_ends_in_seconds"])
		}
		if got, code := admin("reset"); code != 0 || got["reset"] != true {
			t.Errorf("reset: exit %d, %v", code, got)
		}
		if got := codesOf(p.ask(request("api", desc("tenant", tenant)))); got != "OK: OK" {
			t.Errorf("after the reset: %s, want OK (counter and penalty gone)", got)
		}
		if got, _ := admin("counter"); got["remaining"] != 2.0 || got["penalty_ends_in_seconds"] != nil {
			t.Errorf("counter after the reset and a request: %v, want 2 remaining and no penalty", got)
		}
		line := p.log.waitFor(t, regexp.MustCompile(`msg="admin: counter reset".*`), 5*time.Second)[0]
		if !strings.Contains(line, "admin=support") || strings.Contains(line, tenant) || strings.Contains(line, token) {
			t.Errorf("reset logged as %q: want the token's name, neither the tenant's value nor the token", line)
		}

		q := url.Values{"domain": {"api"}, "entry": {"tenant=" + tenant}}.Encode()
		for _, auth := range []string{"", "Bearer wrong-token-of-16-bytes", "Basic " + token, "Bearer " + token + "x"} {
			req, _ := http.NewRequest("POST", addr+"/v1/counter/reset?"+q, nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("Authorization %q: %s, want 401", auth, resp.Status)
			}
		}
		if strings.Contains(p.log.String(), token) {
			t.Error("the token reached the log")
		}
		for name, query := range map[string]string{
			"no domain":    "entry=tenant=x",
			"no entry":     "domain=api",
			"a huge query": "domain=api&entry=tenant=" + strings.Repeat("x", 5000),
			"no rule":      "domain=api&entry=user=x",
		} {
			req, _ := http.NewRequest("GET", addr+"/v1/counter?"+query, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if want := map[bool]int{true: 404, false: 400}[name == "no rule"]; resp.StatusCode != want {
				t.Errorf("%s: %s, want %d", name, resp.Status, want)
			}
		}
	})
}

// TestServeAdminNeedsAToken: --admin without a token file, or a token
// file of short tokens, is a usage error at start.
func TestServeAdminNeedsAToken(t *testing.T) {
	t.Parallel()
	bin := tollgateBinary(t)
	short := filepath.Join(t.TempDir(), "tokens")
	write(t, short, "short\n")
	for _, args := range [][]string{
		{"--admin", "127.0.0.1:0"},
		{"--admin-token-file", short},
		{"--admin", "127.0.0.1:0", "--admin-token-file", short},
	} {
		cmd := exec.Command(bin, append([]string{"serve", "--config", "../../internal/service/config/testdata/envoy", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, args...)...)
		cmd.Env = withoutTollgateEnv(os.Environ())
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(string(out), "admin") {
			t.Errorf("serve %v: exit %d, %s; want a refusal naming the admin flags", args, code, out)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
