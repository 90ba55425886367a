package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// client returns an HTTP client whose connections come from local, an
// address in 127.0.0.0/8: a distinct client address on loopback.
func client(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

type answer struct {
	code   int
	header http.Header
	body   string
}

func send(t *testing.T, c *http.Client, url string, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func flat(h http.Header) map[string]string {
	m := map[string]string{}
	for k, v := range h {
		m[http.CanonicalHeaderKey(k)] = strings.Join(v, ", ")
	}
	// sfItems looks fields up by their wire spelling.
	for _, f := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
		if v, ok := m[http.CanonicalHeaderKey(f)]; ok {
			m[f] = v
		}
	}
	return m
}

// upstreamApp is the API behind the proxies: it says hello.
func upstreamApp(t *testing.T) *httptest.Server {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-App", "yes")
		io.WriteString(w, "hello "+r.URL.Path)
	}))
	t.Cleanup(app.Close)
	return app
}

const edgeRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}
  - key: api_key
    descriptors:
      - key: path
        rate_limit: {name: per_key_path, unit: minute, requests_per_unit: 2, algorithm: token_bucket}
`

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func nginxBinary(t *testing.T) string {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	t.Fatal("nginx is not installed: run make deps (scripts/deps.sh)")
	return ""
}

// startNginx runs the shipped examples/nginx/nginx.conf, only its addresses
// changed, in front of tollgate (its HTTP base URL) and app, and returns
// nginx's base URL.
func startNginx(t *testing.T, tollgateURL, appURL string) string {
	t.Helper()
	conf, err := os.ReadFile("../../examples/nginx/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	return startNginxText(t, string(conf), "127.0.0.1:8088",
		[2]string{"server 127.0.0.1:8080;", "server " + strings.TrimPrefix(tollgateURL, "http://") + ";"},
		[2]string{"server 127.0.0.1:9000;", "server " + strings.TrimPrefix(appURL, "http://") + ";"})
}

// startNginxText runs nginx with the configuration conf, in which each
// pair of replace is replaced once (each must be there), and listen — the
// configuration's listen address — is moved to a free port. It returns
// nginx's base URL.
func startNginxText(t *testing.T, conf, listen string, replace ...[2]string) string {
	t.Helper()
	bin := nginxBinary(t)
	addr := freePort(t)
	replace = append(replace, [2]string{"listen " + listen + ";", "listen " + addr + ";"})
	for _, r := range replace {
		if !strings.Contains(conf, r[0]) {
			t.Fatalf("nginx configuration has no %q", r[0])
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	dir := t.TempDir()
	prefix := filepath.Join(dir, "nginx")
	for _, d := range []string{"logs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(prefix, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// nginx's workers drop root for nobody, who must reach the prefix.
	for _, d := range []string{dir, prefix} {
		os.Chmod(d, 0o755)
	}
	confPath := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", prefix, "-c", confPath, "-g", "daemon off;")
	out := &logBuffer{added: make(chan struct{}, 1)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGQUIT) // graceful stop
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			logs, _ := os.ReadFile(filepath.Join(prefix, "logs", "error.log"))
			t.Logf("nginx output:\n%s\nerror.log:\n%s", out.String(), logs)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx not listening on %s after 10s: %s", addr, out.String())
		}
		select {
		case <-exited:
			t.Fatalf("nginx exited: %s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestNginxAuthRequest runs the shipped examples/nginx/nginx.conf — only
// its addresses changed — with a real nginx in front of a real tollgate
// serve, and checks what clients get.
func TestNginxAuthRequest(t *testing.T) {
	t.Parallel()
	app := upstreamApp(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeFile(t, rules, edgeRules)
	tg := startTollgate(t, "serve", "--config", rules)

	base := startNginx(t, tg.http, app.URL)

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
	if got.code != 429 {
		t.Fatalf("A 4th: %d %q, want 429", got.code, got.body)
	}
	if ra, err := strconv.Atoi(got.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Errorf("A 4th: Retry-After %q, want 1 to 60", got.header.Get("Retry-After"))
	}
	var problem struct{ Status int }
	if err := json.Unmarshal([]byte(got.body), &problem); err != nil || problem.Status != 429 || got.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("A 4th: body %q (%s), want a problem+json of status 429", got.body, got.header.Get("Content-Type"))
	}
	if r := sfItems(t, flat(got.header), "RateLimit"); !strings.HasPrefix(r, `"edge.remote_address" r=0 t=`) {
		t.Errorf("A 4th: RateLimit %s, want r=0", r)
	}
	// A spoofed X-Forwarded-For does not give A a new allowance: nginx
	// overwrites it with the real address.
	if got := send(t, a, base+"/hello", "X-Forwarded-For", "198.51.100.1"); got.code != 429 {
		t.Errorf("A spoofing X-Forwarded-For: %d, want 429", got.code)
	}

	// Client B has its own allowance; with an API key, the per key and
	// path limit (2 per minute) applies too and reports both policies.
	b := client("127.0.0.3")
	for i := range 2 {
		got := send(t, b, base+"/export", "X-API-Key", "k1")
		if got.code != 200 {
			t.Fatalf("B %d: %d %q, want 200", i+1, got.code, got.body)
		}
		p := sfItems(t, flat(got.header), "RateLimit-Policy")
		if want := `"edge.remote_address" q=3 w=60, "per_key_path" q=2 w=60`; p != want {
			t.Errorf("B %d: RateLimit-Policy %s, want %s", i+1, p, want)
		}
	}
	if got := send(t, b, base+"/export", "X-API-Key", "k1"); got.code != 429 {
		t.Errorf("B 3rd with the key: %d, want 429 (2 per key and path)", got.code)
	}
	if got := send(t, b, base+"/other", "X-API-Key", "k1"); got.code != 429 {
		// As in envoyproxy/ratelimit, each descriptor spends on its own:
		// the 3rd request spent B's address allowance though its key and
		// path were over.
		t.Errorf("B 4th: %d, want 429 (3 per address)", got.code)
	}
	if got := tg.metric(`tollgate_serve_requests_total{api="nginx",code="over_limit"}`); got < 3 {
		t.Errorf("nginx over_limit requests = %v, want ≥ 3", got)
	}
}

// TestProxy runs tollgate proxy in front of an app.
func TestProxy(t *testing.T) {
	t.Parallel()
	app := upstreamApp(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeFile(t, rules, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket}\n")
	p := startTollgate(t, "proxy", "--config", rules, "--upstream", app.URL)
	c := client("127.0.0.4")
	for i := range 2 {
		got := send(t, c, p.proxy+"/items")
		if got.code != 200 || got.body != "hello /items" || got.header.Get("X-App") != "yes" {
			t.Fatalf("%d: %d %q, want the app's 200", i+1, got.code, got.body)
		}
		if r := sfItems(t, flat(got.header), "RateLimit"); !strings.HasPrefix(r, `"api.remote_address" r=`+strconv.Itoa(1-i)) {
			t.Errorf("%d: RateLimit %s", i+1, r)
		}
	}
	// Not trusted: a forwarding header from the client changes nothing.
	got := send(t, c, p.proxy+"/items", "X-Forwarded-For", "198.51.100.7")
	if got.code != 429 || got.header.Get("Content-Type") != "application/problem+json" || got.header.Get("X-App") != "" {
		t.Fatalf("3rd: %d %q %v, want tollgate's 429 problem", got.code, got.body, got.header)
	}
	if ra, err := strconv.Atoi(got.header.Get("Retry-After")); err != nil || ra < 1 || ra > 30 {
		t.Errorf("3rd: Retry-After %q, want 1 to 30 (a token every 30 s)", got.header.Get("Retry-After"))
	}
	if got := send(t, client("127.0.0.5"), p.proxy+"/items"); got.code != 200 {
		t.Errorf("another client: %d, want 200", got.code)
	}
	if got := p.metric(`tollgate_serve_requests_total{api="proxy",code="over_limit"}`); got != 1 {
		t.Errorf("proxy over_limit = %v, want 1", got)
	}
}
