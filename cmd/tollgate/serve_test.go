package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// The tests below build the real tollgate binary once and run it as a
// separate process, on free loopback ports, against real redis-server
// processes: what a user runs is what is tested.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	// extraTempDirs are other binaries' directories, removed by TestMain.
	extraTempDirs []string
)

func tollgateBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "tollgate")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	for _, dir := range extraTempDirs {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// proc is a running tollgate process.
type proc struct {
	t        *testing.T
	cmd      *exec.Cmd
	http     string // base URL
	grpc     string // host:port
	proxy    string // base URL of tollgate proxy
	log      *logBuffer
	exited   chan struct{}
	exitErr  error
	rls      pb.RateLimitServiceClient
	conn     *grpc.ClientConn
	stopOnce sync.Once
}

// logBuffer collects a process's stderr and lets tests wait for a line.
type logBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	added chan struct{}
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	select {
	case l.added <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitFor waits until the log matches re, and returns the match.
func (l *logBuffer) waitFor(t *testing.T, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if m := re.FindStringSubmatch(l.String()); m != nil {
			return m
		}
		select {
		case <-l.added:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("log did not match %v within %v:\n%s", re, timeout, l.String())
		}
	}
}

// listening matches the line that says where tollgate listens, in the text
// and the JSON log formats.
var listening = regexp.MustCompile(`msg=listening http=(\S+) (grpc|proxy)=(\S+)|"msg":"listening","http":"([^"]+)","(grpc|proxy)":"([^"]+)"`)

// startTollgate runs tollgate with args (after the subcommand) on free
// loopback ports and waits until it listens.
func startTollgate(t *testing.T, sub string, args ...string) *proc {
	t.Helper()
	return startTollgateWith(t, launch{}, sub, args...)
}

// withoutTollgateEnv is env without the variables tollgate reads, so that
// a CI's PORT or HOST does not start tollgate in envoy's mode.
func withoutTollgateEnv(env []string) []string {
	read := map[string]bool{"REDIS_URL": true, "REDIS_AUTH": true}
	for _, v := range envoyVars {
		read[v.name] = true
	}
	var out []string
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); !read[name] {
			out = append(out, kv)
		}
	}
	return out
}

// launch is how a test starts tollgate, beyond its arguments.
type launch struct {
	// env is added to the test's environment, from which the variables
	// tollgate reads (REDIS_URL, REDIS_AUTH, and every one of envoy's,
	// PORT and HOST among them) are first removed.
	env []string
	// nofile, when positive, is the process's limit of open files.
	nofile int
}

func startTollgateWith(t *testing.T, l launch, sub string, args ...string) *proc {
	t.Helper()
	bin := tollgateBinary(t)
	full := append([]string{sub, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, args...)
	if sub == "proxy" {
		full = append(full, "--listen", "127.0.0.1:0")
	}
	cmd := exec.Command(bin, full...)
	if l.nofile > 0 {
		// The shell sets the limit, soft and hard, then becomes tollgate.
		cmd = exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, l.nofile), bin}, full...)...)
	}
	cmd.Env = withoutTollgateEnv(os.Environ())
	cmd.Env = append(cmd.Env, l.env...)
	p := &proc{t: t, cmd: cmd, log: &logBuffer{added: make(chan struct{}, 1)}, exited: make(chan struct{})}
	p.cmd.Stderr = p.log
	p.cmd.Stdout = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("tollgate log:\n%s", p.log.String())
		}
	})
	m := p.log.waitFor(t, listening, 20*time.Second)
	if m[1] == "" {
		m = m[3:] // the JSON form's groups
	}
	p.http = "http://" + m[1]
	if m[2] == "proxy" {
		p.proxy = "http://" + m[3]
		return p
	}
	p.grpc = m[3]
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.conn = conn
	p.rls = pb.NewRateLimitServiceClient(conn)
	return p
}

func (p *proc) stop() {
	p.stopOnce.Do(func() {
		if p.conn != nil {
			p.conn.Close()
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
}

func (p *proc) ask(req *pb.RateLimitRequest) *pb.RateLimitResponse {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := p.rls.ShouldRateLimit(ctx, req)
	if err != nil {
		p.t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func (p *proc) get(path string) (int, string) {
	p.t.Helper()
	resp, err := http.Get(p.http + path)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metric returns the value of the series whose line starts with prefix
// (name and labels), or 0 when there is none.
func (p *proc) metric(prefix string) float64 {
	p.t.Helper()
	_, body := p.get("/metrics")
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[len(prefix):]), 64)
			if err != nil {
				p.t.Fatalf("metric %s: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// desc makes a descriptor from key, value pairs.
func desc(pairs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(pairs); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: pairs[i], Value: pairs[i+1]})
	}
	return d
}

func request(domain string, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func randomID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// codes returns the overall code and each status's code, as a string such
// as "OVER_LIMIT: OK OVER_LIMIT".
func codesOf(r *pb.RateLimitResponse) string {
	s := r.OverallCode.String() + ":"
	for _, st := range r.Statuses {
		s += " " + st.Code.String()
	}
	return s
}

// stores runs f against the memory store and against a real Redis.
func stores(t *testing.T, f func(t *testing.T, storeArgs []string)) {
	t.Run("memory", func(t *testing.T) { t.Parallel(); f(t, nil) })
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.NewServer(t)
		// A generous deadline: these tests check decisions, and a loaded
		// machine must not turn them into failure-mode answers.
		// TestServeRedisDown tests the deadline itself.
		f(t, []string{"--redis", rdb.URL(), "--redis-prefix", testkit.KeyPrefix(t), "--timeout", "5s"})
	})
}

// TestServeEnvoyRules runs the service on a rules directory written for
// envoyproxy/ratelimit, unchanged, and checks its answers over gRPC.
func TestServeEnvoyRules(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, storeArgs []string) {
		p := startTollgate(t, "serve", append([]string{"--config", "../../internal/service/config/testdata/envoy"}, storeArgs...)...)
		tenant := "t-" + randomID()

		// alice has 1 per minute: one OK, then over the limit.
		r := p.ask(request("edge", desc("tenant", tenant, "user", "alice")))
		if got, want := codesOf(r), "OK: OK"; got != want {
			t.Errorf("alice 1st: %s, want %s", got, want)
		}
		st := r.Statuses[0]
		if st.CurrentLimit.GetRequestsPerUnit() != 1 || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.GetName() != "per_user" {
			t.Errorf("alice: current_limit %v, want 1 per MINUTE named per_user", st.CurrentLimit)
		}
		if st.LimitRemaining != 0 {
			t.Errorf("alice: limit_remaining %d, want 0", st.LimitRemaining)
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
			t.Errorf("alice: duration_until_reset %v, want within a minute", d)
		}
		h := headersOf(r)
		if got := sfItems(t, h, "RateLimit-Policy"); got != `"per_user" q=1 w=60` {
			t.Errorf("alice 1st: RateLimit-Policy %s, want \"per_user\" q=1 w=60", got)
		}
		if got := sfItems(t, h, "RateLimit"); !regexp.MustCompile(`^"per_user" r=0 t=([1-9]|[1-5][0-9]|60)$`).MatchString(got) {
			t.Errorf("alice 1st: RateLimit %s, want r=0 and t within a minute", got)
		}
		if _, ok := h["Retry-After"]; ok {
			t.Errorf("alice 1st: Retry-After on an allowed request")
		}
		r = p.ask(request("edge", desc("tenant", tenant, "user", "alice")))
		if got, want := codesOf(r), "OVER_LIMIT: OVER_LIMIT"; got != want {
			t.Errorf("alice 2nd: %s, want %s", got, want)
		}
		h = headersOf(r)
		if ra, err := strconv.Atoi(h["Retry-After"]); err != nil || ra < 1 || ra > 60 {
			t.Errorf("alice 2nd: Retry-After %q, want 1 to 60 seconds", h["Retry-After"])
		} else if got, want := sfItems(t, h, "RateLimit"), fmt.Sprintf(`"per_user" r=0 t=%d`, ra); got != want {
			t.Errorf("alice 2nd: RateLimit %s, want %s (t equal to Retry-After)", got, want)
		}

		// Statuses come in request order; a descriptor that matches nothing
		// and an unknown domain answer OK with no limit.
		r = p.ask(request("edge", desc("nothing", "here"), desc("tenant", tenant, "user", "alice"), desc("tenant", tenant, "internal", "x")))
		if got, want := codesOf(r), "OVER_LIMIT: OK OVER_LIMIT OK"; got != want {
			t.Errorf("mixed: %s, want %s", got, want)
		}
		if r.Statuses[0].CurrentLimit != nil {
			t.Errorf("no match: current_limit %v, want none", r.Statuses[0].CurrentLimit)
		}
		if got := r.Statuses[2].LimitRemaining; got != math.MaxUint32 {
			t.Errorf("unlimited: limit_remaining %d, want MaxUint32", got)
		}
		r = p.ask(request("no-such-domain", desc("tenant", tenant, "user", "alice")))
		if got, want := codesOf(r), "OK: OK"; got != want {
			t.Errorf("unknown domain: %s, want %s", got, want)
		}

		// replaces: category=account (4/min) replaces per_user, so alice's
		// own limit is neither checked nor spent while it applies.
		r = p.ask(request("edge", desc("category", "account"), desc("tenant", tenant, "user", "alice")))
		if got, want := codesOf(r), "OK: OK OK"; got != want {
			t.Errorf("replaces: %s, want %s", got, want)
		}
		if r.Statuses[1].CurrentLimit != nil {
			t.Errorf("replaced rule: current_limit %v, want none", r.Statuses[1].CurrentLimit)
		}

		// requests_per_unit: 0 denies.
		r = p.ask(request("edge", desc("tenant", tenant, "user", "mallory")))
		if got, want := codesOf(r), "OVER_LIMIT: OVER_LIMIT"; got != want {
			t.Errorf("mallory: %s, want %s", got, want)
		}

		// shadow_mode: 3 per minute, counted, never enforced.
		for i := range 5 {
			r = p.ask(request("edge", desc("tenant", tenant, "path", "/trial")))
			if got, want := codesOf(r), "OK: OK"; got != want {
				t.Errorf("shadow %d: %s, want %s", i, got, want)
			}
		}
		if got, want := p.metric(`tollgate_serve_decisions_total{domain="edge",outcome="shadow",rule="edge.tenant.path_/trial"}`), 2.0; got != want {
			t.Errorf("shadow decisions = %v, want %v", got, want)
		}

		// hits_addend: bob has 3 per minute. A request of 3 hits spends
		// them all; hits_addend 0 on the descriptor looks without spending;
		// then one more hit is over.
		r = p.ask(&pb.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("tenant", tenant, "user", "bob")}})
		if got, want := codesOf(r), "OK: OK"; got != want || r.Statuses[0].LimitRemaining != 0 {
			t.Errorf("3 hits: %s remaining %d, want %s remaining 0", got, r.Statuses[0].LimitRemaining, want)
		}
		look := desc("tenant", tenant, "user", "bob")
		look.HitsAddend = wrapperspb.UInt64(0)
		for range 2 {
			r = p.ask(request("edge", look))
			if got, want := codesOf(r), "OK: OK"; got != want {
				t.Errorf("hits_addend 0: %s, want %s", got, want)
			}
		}
		r = p.ask(request("edge", desc("tenant", tenant, "user", "bob")))
		if got, want := codesOf(r), "OVER_LIMIT: OVER_LIMIT"; got != want {
			t.Errorf("after 3 hits: %s, want %s", got, want)
		}
		// More hits than the limit can ever admit: over, nothing spent.
		carol := desc("tenant", tenant, "user", "carol")
		carol.HitsAddend = wrapperspb.UInt64(4)
		if got, want := codesOf(p.ask(request("edge", carol))), "OVER_LIMIT: OVER_LIMIT"; got != want {
			t.Errorf("4 hits on 3/min: %s, want %s", got, want)
		}
		if got, want := codesOf(p.ask(request("edge", desc("tenant", tenant, "user", "carol")))), "OK: OK"; got != want {
			t.Errorf("carol after a refused 4: %s, want %s", got, want)
		}

		// share_threshold: every files/* value spends one counter of 10.
		prefix := "files/" + tenant + "/"
		shared := desc("files", prefix+"a.pdf")
		shared.HitsAddend = wrapperspb.UInt64(6)
		p.ask(request("edge", shared))
		other := desc("files", prefix+"b.csv")
		other.HitsAddend = wrapperspb.UInt64(5)
		// Another test run may have spent this hour's shared counter too,
		// so only the sum matters: 6 + 5 > 10 is over.
		if got, want := codesOf(p.ask(request("edge", other))), "OVER_LIMIT: OVER_LIMIT"; got != want {
			t.Errorf("share_threshold: %s, want %s", got, want)
		}

		// Invalid requests are gRPC errors, as in envoyproxy/ratelimit.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := p.rls.ShouldRateLimit(ctx, request("edge")); status.Code(err) != codes.InvalidArgument {
			t.Errorf("no descriptors: err %v, want InvalidArgument", err)
		}
		if _, err := p.rls.ShouldRateLimit(ctx, request("", desc("a", "b"))); status.Code(err) != codes.InvalidArgument {
			t.Errorf("no domain: err %v, want InvalidArgument", err)
		}

		// The gRPC health service says SERVING.
		hc, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health: %v, %v; want SERVING", hc, err)
		}
	})
}

func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServeJSON(t *testing.T) {
	t.Parallel()
	p := startTollgate(t, "serve", "--config", "../../internal/service/config/testdata/envoy")
	tenant := "t-" + randomID()
	body := `{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"` + tenant + `"},{"key":"user","value":"alice"}]}]}`
	code, out := postJSON(t, p.http+"/json", body)
	if code != http.StatusOK {
		t.Fatalf("1st: %d %s, want 200", code, out)
	}
	var resp pb.RateLimitResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("response %q: %v", out, err)
	}
	if got, want := codesOf(&resp), "OK: OK"; got != want {
		t.Errorf("1st: %s, want %s", got, want)
	}
	code, out = postJSON(t, p.http+"/json", body)
	if code != http.StatusTooManyRequests || !strings.Contains(out, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("2nd: %d %s, want 429 and OVER_LIMIT", code, out)
	}
	for _, bad := range []string{`{`, `{"domain":"edge"}`, `{"domain":"","descriptors":[{"entries":[]}]}`, `{"nope":1}`} {
		if code, out := postJSON(t, p.http+"/json", bad); code != http.StatusBadRequest {
			t.Errorf("POST %s: %d %s, want 400", bad, code, out)
		}
	}
	if code, body := p.get("/healthcheck"); code != 200 || body != "OK" {
		t.Errorf("/healthcheck: %d %q, want 200 OK", code, body)
	}
	if code, body := p.get("/readyz"); code != 200 {
		t.Errorf("/readyz: %d %q, want 200", code, body)
	}
	if got := p.metric(`tollgate_serve_requests_total{api="json",code="over_limit"}`); got != 1 {
		t.Errorf("json over_limit requests = %v, want 1", got)
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	// Write then rename, as editors and config tools do, so the service
	// never reads half a file.
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func rulesFile(limit int) string {
	return fmt.Sprintf("domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", limit)
}

// TestServeReload changes the rules under a running service: a good file is
// picked up, a bad one is refused with its line number and the old rules
// stay; SIGHUP reloads too.
func TestServeReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, rulesFile(5))
	p := startTollgate(t, "serve", "--config", dir)
	limitOf := func() uint32 {
		return p.ask(request("reload", desc("k", randomID()))).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	if got := limitOf(); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	waitLimit := func(want uint32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for limitOf() != want {
			if time.Now().After(deadline) {
				t.Fatalf("limit still %d after 10s, want %d", limitOf(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	writeFile(t, path, rulesFile(7))
	waitLimit(7)

	writeFile(t, path, "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unti: 9}\n")
	p.log.waitFor(t, regexp.MustCompile(`rules not loaded; the previous rules stay in force.*rules.yaml:4:`), 10*time.Second)
	if got := limitOf(); got != 7 {
		t.Errorf("after a bad file: limit %d, want 7 (the old rules)", got)
	}
	if got := p.metric(`tollgate_serve_config_reloads_total{result="failure"}`); got < 1 {
		t.Errorf("reload failures = %v, want ≥ 1", got)
	}
	if code, _ := p.get("/readyz"); code != 200 {
		t.Errorf("/readyz after a bad file: %d, want 200 (the old rules serve)", code)
	}

	// With the watch off, only SIGHUP reloads.
	dir2 := t.TempDir()
	path2 := filepath.Join(dir2, "rules.yaml")
	writeFile(t, path2, rulesFile(5))
	q := startTollgate(t, "serve", "--config", path2, "--watch=false")
	writeFile(t, path2, rulesFile(11))
	if got := q.ask(request("reload", desc("k", randomID()))).Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 5 {
		t.Errorf("before SIGHUP: limit %d, want 5", got)
	}
	q.cmd.Process.Signal(syscall.SIGHUP)
	q.log.waitFor(t, regexp.MustCompile(`(?s)msg="rules loaded".*msg="rules loaded"`), 10*time.Second)
	if got := q.ask(request("reload", desc("k", randomID()))).Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 11 {
		t.Errorf("after SIGHUP: limit %d, want 11", got)
	}
}

func TestServeRejectsBadRulesAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	writeFile(t, path, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	out, err := exec.Command(tollgateBinary(t), "serve", "--config", path, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1", err)
	}
	if want := path + `:4:24: invalid rate limit unit "fortnight"`; !strings.Contains(string(out), want) {
		t.Errorf("output %q does not contain %q", out, want)
	}
}

// TestServeRedisDown stops and pauses Redis under a running service: it
// keeps answering within its deadline, by each rule's failure mode, says it
// is not ready, and recovers when Redis is back.
func TestServeRedisDown(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, `domain: d
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: closed}
`)
	p := startTollgate(t, "serve", "--config", path, "--redis", rdb.URL(), "--timeout", "50ms")
	id := randomID()
	both := request("d", desc("open", id), desc("closed", id))
	// With Redis up, decisions come from Redis. On a loaded machine one can
	// miss the 50 ms deadline and be answered by failure mode instead: ask
	// again, within reason.
	healthy := func(what string) {
		t.Helper()
		got := ""
		for range 20 {
			if got = codesOf(p.ask(both)); got == "OK: OK OK" {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: %s, want OK: OK OK", what, got)
	}
	healthy("Redis up")
	waitReady := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, _ := p.get("/readyz")
			if code == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz still %d after 10s, want %d", code, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitReady(200)

	// The bound is far above the 50 ms deadline, for a loaded machine, and
	// far below go-redis's own 3 s read timeout and 5 s dial timeout that
	// a service without a deadline would wait.
	const bound = time.Second
	check := func(what string) {
		t.Helper()
		for range 5 {
			start := time.Now()
			r := p.ask(both)
			if took := time.Since(start); took > bound {
				t.Errorf("%s: answered in %v, want within %v", what, took, bound)
			}
			if got, want := codesOf(r), "OVER_LIMIT: OK OVER_LIMIT"; got != want {
				t.Errorf("%s: %s, want %s (open answers OK, closed OVER_LIMIT)", what, got, want)
			}
		}
	}

	if err := rdb.Stop(); err != nil {
		t.Fatal(err)
	}
	check("Redis stopped")
	waitReady(503)
	if code, _ := p.get("/healthcheck"); code != 200 {
		t.Errorf("/healthcheck with Redis down: %d, want 200 (the service still answers)", code)
	}
	if got := p.metric(`tollgate_serve_decisions_total{domain="d",outcome="fail_open",rule="d.open"}`); got < 5 {
		t.Errorf("fail_open decisions = %v, want ≥ 5", got)
	}
	if got := p.metric(`tollgate_serve_decisions_total{domain="d",outcome="fail_closed",rule="d.closed"}`); got < 5 {
		t.Errorf("fail_closed decisions = %v, want ≥ 5", got)
	}
	if !strings.Contains(p.log.String(), "store failed; answered by the rule's failure mode") {
		t.Errorf("no log line for the store failure")
	}

	if err := rdb.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(200)
	healthy("Redis back")

	// Paused (SIGSTOP): connections stay open and nothing answers, the case
	// only a deadline catches.
	if err := rdb.Pause(); err != nil {
		t.Fatal(err)
	}
	check("Redis paused")
	waitReady(503)
	if err := rdb.Resume(); err != nil {
		t.Fatal(err)
	}
	waitReady(200)
}

// TestServeDrain sends SIGTERM: the service fails /readyz at once, keeps
// answering during --shutdown-delay, then stops cleanly with status 0.
func TestServeDrain(t *testing.T) {
	t.Parallel()
	p := startTollgate(t, "serve", "--config", "../../internal/service/config/testdata/envoy", "--shutdown-delay", "1s")
	if code, _ := p.get("/readyz"); code != 200 {
		t.Fatalf("/readyz before SIGTERM: %d", code)
	}
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.log.waitFor(t, regexp.MustCompile(`shutting down`), 5*time.Second)
	if code, body := p.get("/readyz"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz while draining: %d %q, want 503 shutting down", code, body)
	}
	if code, _ := p.get("/healthcheck"); code != 500 {
		t.Errorf("/healthcheck while draining: %d, want 500", code)
	}
	// Requests in flight and arriving during the delay are still answered.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := p.rls.ShouldRateLimit(ctx, request("edge", desc("tenant", randomID()))); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if time.Since(start) < 900*time.Millisecond {
			t.Errorf("request during the shutdown delay failed: %v", err)
		}
	}
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("not stopped 15s after SIGTERM")
	}
	if p.exitErr != nil {
		t.Errorf("exit: %v, want status 0", p.exitErr)
	}
	if !strings.Contains(p.log.String(), "msg=stopped") {
		t.Errorf("no 'stopped' log line")
	}
}

func TestServeUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve"}, 2, "--config is required"},
		{[]string{"serve", "--config", "x.yaml", "--failure-mode", "ajar"}, 2, `--failure-mode "ajar"`},
		{[]string{"serve", "--config", "x.yaml", "--log-interval", "-1s"}, 2, `--log-interval -1s`},
		{[]string{"serve", "--config", "../../internal/service/config/testdata/envoy", "--redis", "http://x"}, 2, `--redis: redis URL scheme "http"`},
		{[]string{"serve", "--config", "/nonexistent/rules.yaml"}, 1, "no such file"},
		{[]string{"serve", "--config", "x.yaml", "--compat", "lyft"}, 2, `--compat "lyft"`},
		{[]string{"serve", "--config", "x.yaml", "--rules-max-files", "0"}, 2, `--rules-max-files 0`},
		{[]string{"serve", "--config", "../../internal/service/config/testdata/envoy", "--rules-max-files", "1"}, 1, `limit of 1 .yaml and .yml files`},
		{[]string{"serve", "--config", "../../internal/service/config/testdata/envoy", "--rules-max-file-bytes", "100"}, 1, `larger than the limit of 100 bytes`},
		{[]string{"serve", "--config", "x.yaml", "--near-limit-ratio", "1.5"}, 2, `--near-limit-ratio 1.5`},
		{[]string{"serve", "--config", "../../internal/service/config/testdata/envoy", "--header-limit", "X Limit"}, 1, `header name "X Limit"`},
	}
	for _, tc := range tests {
		var out bytes.Buffer
		code := run(context.Background(), append([]string{"tollgate"}, tc.args...), func(string) string { return "" }, &out, &out)
		if code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v: exit %d, output %q; want %d and %q", tc.args, code, out.String(), tc.code, tc.want)
		}
	}
}

// headersOf returns response_headers_to_add as a map.
func headersOf(r *pb.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	return h
}

// sfItems parses a RateLimit or RateLimit-Policy field with a
// structured-field parser, as a client would, and prints its items as
// `"name" param=value ...`, one item after another.
func sfItems(t *testing.T, h map[string]string, field string) string {
	t.Helper()
	v, ok := h[field]
	if !ok {
		t.Errorf("%s missing from %v", field, h)
		return ""
	}
	list, err := httpsfv.UnmarshalList([]string{v})
	if err != nil {
		t.Errorf("%s: %q is not a structured-field list: %v", field, v, err)
		return ""
	}
	var out []string
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Errorf("%s: %#v is not an item", field, m)
			continue
		}
		s := fmt.Sprintf("%q", it.Value)
		for _, k := range it.Params.Names() {
			pv, _ := it.Params.Get(k)
			s += fmt.Sprintf(" %s=%v", k, pv)
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// TestServeRedisCluster runs the service on a real 3-master Redis Cluster
// through a redis+cluster:// URL: keys spread over every master, each limit
// exact.
func TestServeRedisCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.NewCluster(t, 3, 0)
	addrs := cl.Addrs()
	url := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window_counter}\n")
	p := startTollgate(t, "serve", "--config", path, "--redis", url, "--timeout", "5s")
	for i := range 30 {
		user := fmt.Sprintf("u%d-%s", i, randomID())
		for j, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
			if got := codesOf(p.ask(request("d", desc("user", user)))); got != want {
				t.Errorf("user %d, request %d: %s, want %s", i, j+1, got, want)
			}
		}
	}
	if got := p.metric(`tollgate_serve_store_errors_total{reason="error"}`) + p.metric(`tollgate_serve_store_errors_total{reason="timeout"}`); got != 0 {
		t.Errorf("%v store errors on a healthy Cluster", got)
	}
}
