package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// secret is the Redis password in these tests; no log line may show it.
const secret = "s3cr3t-M4RK-pw"

// passwordRedis starts a real redis-server that requires secret.
func passwordRedis(t *testing.T) *redistest.Server {
	t.Helper()
	rdb := redistest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Set after start: redistest checks the server with a PING of its own.
	if err := rdb.Client(t).ConfigSet(ctx, "requirepass", secret).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb
}

// readyWithin reports whether /readyz answers 200 — the store answers its
// probe — within d.
func (p *proc) readyWithin(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if code, _ := p.get("/readyz"); code == 200 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestServeRedisCredentials signs in to a real Redis that requires a
// password, from every source: in each case the source that should win
// holds the right password and every other one a wrong one.
func TestServeRedisCredentials(t *testing.T) {
	t.Parallel()
	rdb := passwordRedis(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeFile(t, rules, rulesFile(10))
	right := filepath.Join(dir, "right")
	writeFile(t, right, secret+"\n")
	withPw := func(pw string) string { return "redis://:" + pw + "@" + rdb.Addr() }
	bare := "redis://" + rdb.Addr()
	elsewhere := "redis://:" + secret + "@127.0.0.1:1" // nothing listens there
	for _, tc := range []struct {
		name  string
		args  []string
		env   []string
		ready bool
	}{
		{"REDIS_URL", nil, []string{"REDIS_URL=" + withPw(secret)}, true},
		{"REDIS_AUTH with --redis", []string{"--redis", bare}, []string{"REDIS_AUTH=" + secret}, true},
		{"REDIS_AUTH over REDIS_URL's", nil, []string{"REDIS_URL=" + withPw("wrong"), "REDIS_AUTH=" + secret}, true},
		{"--redis over REDIS_URL", []string{"--redis", withPw(secret)}, []string{"REDIS_URL=" + elsewhere}, true},
		{"--redis URL's over REDIS_AUTH", []string{"--redis", withPw(secret)}, []string{"REDIS_AUTH=wrong"}, true},
		{"file over everything", []string{"--redis", withPw("wrong"), "--redis-password-file", right}, []string{"REDIS_AUTH=wrong"}, true},
		{"wrong REDIS_AUTH", []string{"--redis", bare}, []string{"REDIS_AUTH=wrong"}, false},
		{"no password", []string{"--redis", bare}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--config", rules}, tc.args...)
			p := startTollgateWith(t, launch{env: tc.env}, "serve", args...)
			wait := 15 * time.Second
			if !tc.ready {
				wait = 3 * time.Second
			}
			if got := p.readyWithin(wait); got != tc.ready {
				t.Errorf("ready = %v, want %v", got, tc.ready)
			}
			if !strings.Contains(p.log.String(), "store=redis") {
				t.Errorf("not serving from Redis:\n%s", p.log.String())
			}
			p.stop()
			if strings.Contains(p.log.String(), "M4RK") {
				t.Errorf("the log shows the password:\n%s", p.log.String())
			}
		})
	}
}

// TestServeRedisDownLogsJSON kills Redis under a running service with
// --log-format json: go-redis's own complaints come through the service's
// logger, so every line on stderr is JSON, and none shows the password.
func TestServeRedisDownLogsJSON(t *testing.T) {
	t.Parallel()
	rdb := passwordRedis(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, rulesFile(10))
	p := startTollgateWith(t, launch{env: []string{"REDIS_AUTH=" + secret}}, "serve", "--config", rules,
		"--redis", "redis://"+rdb.Addr()+"?dial_timeout=100ms&max_retries=1", "--log-format", "json", "--timeout", "200ms")
	if !p.readyWithin(15 * time.Second) {
		t.Fatal("not ready with Redis up")
	}
	rdb.Close()
	// Decisions keep the pool dialling the dead server for a few seconds.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		p.ask(request("reload", desc("k", randomID())))
		time.Sleep(20 * time.Millisecond)
	}
	p.stop()
	log := p.log.String()
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	for _, line := range lines {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("not JSON: %s", line)
		}
	}
	if strings.Contains(log, "M4RK") {
		t.Errorf("the log shows the password:\n%s", log)
	}
	n := strings.Count(log, `"msg":"redis client"`)
	if n == 0 {
		t.Errorf("no line from go-redis in three seconds of dialling a dead server:\n%s", log)
	}
	t.Logf("%d lines, %d from go-redis", len(lines), n)
}

func TestReadPasswordFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, want string
		ok                  bool
	}{
		{"newline", "pw\n", "pw", true},
		{"crlf", "pw\r\n", "pw", true},
		{"no newline", "pw", "pw", true},
		{"spaces kept", " p w \n", " p w ", true},
		{"empty", "", "", false},
		{"empty line", "\nsecond", "", false},
		{"too long", strings.Repeat("x", 5000), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readPasswordFile(path)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("readPasswordFile = %q, %v; want %q, ok %v", got, err, tc.want, tc.ok)
			}
			if err != nil && tc.content != "" && strings.Contains(err.Error(), tc.content) {
				t.Errorf("error shows the file's content: %v", err)
			}
		})
	}
}
