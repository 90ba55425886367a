package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func caddyBinary(t *testing.T) string {
	if p, err := exec.LookPath("caddy"); err == nil {
		return p
	}
	t.Fatal("caddy is not installed: run make deps (scripts/deps.sh)")
	return ""
}

// readExample returns the text of a shipped example configuration.
func readExample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// failOpenLine is a commented-out line of an example that fails open.
var failOpenLine = regexp.MustCompile(`(?m)^(\s*)#(.*# fail open)$`)

// failOpen uncomments the lines of conf that end in "# fail open", as the
// examples tell a reader to.
func failOpen(t *testing.T, conf string) string {
	t.Helper()
	if !failOpenLine.MatchString(conf) {
		t.Fatal("the configuration has no commented-out line ending in \"# fail open\"")
	}
	return failOpenLine.ReplaceAllString(conf, "$1$2")
}

// startCaddy runs the Caddyfile conf (the shipped examples/caddy/Caddyfile
// or a variant of it), only its addresses changed: tollgate's and the
// app's wherever they appear, the site's and the admin API's moved to free
// ports. It returns Caddy's base URL.
func startCaddy(t *testing.T, conf, tollgateURL, appURL string) string {
	t.Helper()
	addr := freePort(t)
	_, port, _ := net.SplitHostPort(addr)
	for _, r := range [][2]string{
		{"127.0.0.1:8080", strings.TrimPrefix(tollgateURL, "http://")},
		{"127.0.0.1:9000", strings.TrimPrefix(appURL, "http://")},
		{"http://:8089 {", "http://:" + port + " {"},
		{"admin 127.0.0.1:2019", "admin " + freePort(t)},
	} {
		if !strings.Contains(conf, r[0]) {
			t.Fatalf("Caddyfile has no %q", r[0])
		}
		conf = strings.ReplaceAll(conf, r[0], r[1])
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBinary(t), "run", "--config", path, "--adapter", "caddyfile")
	// Caddy keeps its state (the autosaved configuration, certificates)
	// under these: the test's own, not the user's.
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"))
	out := &logBuffer{added: make(chan struct{}, 1)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM) // graceful stop
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("caddy output:\n%s", out.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("caddy not listening on %s after 10s: %s", addr, out.String())
		}
		select {
		case <-exited:
			t.Fatalf("caddy exited: %s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rawGet sends target as it is on the request line (no client library
// cleans it up) to base from local, an address in 127.0.0.0/8, with the
// header lines hdr (name, value, name, value...).
func rawGet(t *testing.T, local, base, target string, hdr ...string) answer {
	t.Helper()
	host := strings.TrimPrefix(base, "http://")
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n"
	for i := 0; i+1 < len(hdr); i += 2 {
		req += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// TestCaddyForwardAuth runs the shipped examples/caddy/Caddyfile — only
// its addresses changed — with a real Caddy in front of a real tollgate
// serve --auth-proxy caddy, and checks what clients get: the limits hold,
// headers a client sends choose neither the path nor the address it is
// counted by, and one path spelt differently is one counter.
func TestCaddyForwardAuth(t *testing.T) {
	t.Parallel()
	app, hits := countingApp(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, edgeRules)
	tg := startTollgate(t, "serve", "--config", rules, "--auth-proxy", "caddy")
	base := startCaddy(t, readExample(t, "caddy/Caddyfile"), tg.http, app.URL)

	// Client A: 3 per minute by address, then 429 with the fields.
	a := client("127.0.0.2")
	for i := range 3 {
		got := send(t, a, base+"/hello")
		if got.code != 200 || got.body != "hello /hello" || got.header.Get("X-App") != "yes" {
			t.Fatalf("A %d: %d %q, want 200 from the app", i+1, got.code, got.body)
		}
		h := flat(got.header)
		if p, want := sfItems(t, h, "RateLimit-Policy"), `"edge.remote_address" q=3 w=60`; p != want {
			t.Errorf("A %d: RateLimit-Policy %s, want %s", i+1, p, want)
		}
		if r, want := sfItems(t, h, "RateLimit"), `"edge.remote_address" r=`+strconv.Itoa(2-i); !strings.HasPrefix(r, want) {
			t.Errorf("A %d: RateLimit %s, want it to start with %s", i+1, r, want)
		}
	}
	got := send(t, a, base+"/hello")
	if got.code != 429 || got.header.Get("X-App") != "" {
		t.Fatalf("A 4th: %d %q, want tollgate's 429", got.code, got.body)
	}
	if ra, err := strconv.Atoi(got.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Errorf("A 4th: Retry-After %q, want 1 to 60", got.header.Get("Retry-After"))
	}
	if r := sfItems(t, flat(got.header), "RateLimit"); !strings.HasPrefix(r, `"edge.remote_address" r=0 t=`) {
		t.Errorf("A 4th: RateLimit %s, want r=0", r)
	}
	// Caddy writes X-Forwarded-For from the connection, whatever A sends.
	for _, h := range [][]string{
		{"X-Forwarded-For", "198.51.100.1"},
		{"X-Real-IP", "198.51.100.2"},
		{"Forwarded", "for=198.51.100.3"},
	} {
		if got := send(t, a, base+"/hello", h...); got.code != 429 {
			t.Errorf("A sending %s: %d, want 429", h[0], got.code)
		}
	}

	// Per API key and path, 2 a minute. Each request comes from its own
	// address, so that only that limit can refuse it.
	next := 10
	from := func() string { next++; return "127.0.0." + strconv.Itoa(next) }
	t.Run("the client's headers", func(t *testing.T) {
		if got := rawGet(t, from(), base, "/export", "X-API-Key", "k1"); got.code != 200 {
			t.Fatalf("k1 /export 1st: %d %q, want 200", got.code, got.body)
		}
		// Each picks another path, method and address in every header a
		// proxy may use: all are counted as /export.
		for i := range 3 {
			other := "/other" + strconv.Itoa(i)
			got := rawGet(t, from(), base, "/export", "X-API-Key", "k1",
				"X-Forwarded-Uri", other, "X-Forwarded-Method", "POST",
				"X-Original-URI", other, "X-Original-Method", "POST",
				"X-Forwarded-For", "198.51.100."+strconv.Itoa(i+10), "X-Forwarded-Host", "elsewhere")
			want := 429
			if i == 0 {
				want = 200 // the 2nd of /export
			}
			if got.code != want {
				t.Errorf("k1 /export claiming %s: %d %q, want %d", other, got.code, got.body, want)
			}
		}
	})

	t.Run("path variants", func(t *testing.T) {
		for i, target := range []string{
			"/login", "//login", // 2 a minute: the rest are over
			"/login?x=1", "/%6Cogin", "/%6cogin", "/./login", "/a/../login", "/../login",
			"/%2Flogin", "/%2flogin", "///login?", base + "/login",
		} {
			want := 429
			if i < 2 {
				want = 200
			}
			if got := rawGet(t, from(), base, target, "X-API-Key", "k2"); got.code != want {
				t.Errorf("k2 %s: %d %q, want %d", target, got.code, got.body, want)
			}
		}
		// Letter case and a trailing slash are the application's to
		// decide (docs/operations.md): other paths, other counters.
		for _, target := range []string{"/Login", "/LOGIN?", "/login/"} {
			if got := rawGet(t, from(), base, target, "X-API-Key", "k2"); got.code != 200 {
				t.Errorf("k2 %s: %d %q, want 200 (another path)", target, got.code, got.body)
			}
		}
	})

	if got := tg.metric(`tollgate_serve_requests_total{api="nginx",code="invalid"}`); got != 0 {
		t.Errorf("invalid /auth requests = %v, want 0", got)
	}
	// Every 200 came from the app, and nothing else reached it.
	ok := tg.metric(`tollgate_serve_requests_total{api="nginx",code="ok"}`)
	if got := float64(hits.Load()); got != ok {
		t.Errorf("requests reaching the app = %v, want %v (those tollgate allowed)", got, ok)
	}
}

// TestCaddyNginxHeaders: tollgate serve left on --auth-proxy nginx behind
// Caddy answers every request 400, naming the flag, and a client adding
// nginx's headers itself gets the same 400, not a path of its choice.
func TestCaddyNginxHeaders(t *testing.T) {
	t.Parallel()
	app, hits := countingApp(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, edgeRules)
	tg := startTollgate(t, "serve", "--config", rules)
	base := startCaddy(t, readExample(t, "caddy/Caddyfile"), tg.http, app.URL)
	for i := range 6 {
		hdr := []string{"X-API-Key", "k"}
		if i > 0 {
			hdr = append(hdr, "X-Original-URI", fmt.Sprintf("/fresh%d", i), "X-Original-Method", "GET")
		}
		got := rawGet(t, "127.0.0.2", base, "/login", hdr...)
		if got.code != 400 || !strings.Contains(got.body, "--auth-proxy caddy") {
			t.Errorf("request %d: %d %q, want a 400 naming --auth-proxy caddy", i+1, got.code, got.body)
		}
	}
	if got := hits.Load(); got != 0 {
		t.Errorf("requests reaching the app = %d, want 0", got)
	}
}

func TestServeAuthProxyFlag(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	code := run(context.Background(), []string{"tollgate", "serve", "--config", "x.yaml", "--auth-proxy", "haproxy"}, func(string) string { return "" }, &out, &out)
	if want := `invalid value "haproxy" for flag --auth-proxy: want nginx, caddy or traefik`; code != 2 || !strings.Contains(out.String(), want) {
		t.Errorf("--auth-proxy haproxy: exit %d, output %q; want 2 and %q", code, out.String(), want)
	}
}
