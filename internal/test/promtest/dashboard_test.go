//go:build linux

package promtest_test

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/promtest"
	"github.com/tollgate/tollgate/internal/test/redistest"
)

var (
	metricName  = regexp.MustCompile(`\btollgate_[a-z0-9_]+`)
	legendLabel = regexp.MustCompile(`{{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*}}`)
)

// TestDashboard runs tollgate serve on a real redis-server and a program
// using the middleware and the local tier, loads both for a few seconds
// (with a failed reload and Redis paused for a second and a half on the
// way), has a real Prometheus scrape them every second with the rules of
// deploy/prometheus, and then runs every query of every panel of the
// dashboard: each must return series that carry the labels its legend
// names, and a number. Every metric the rules and the dashboard name must
// be one that was scraped, every recording rule must record series, and
// the alerts that need no waiting must fire.
func TestDashboard(t *testing.T) {
	t.Parallel()
	d, rules := readDashboard(t), readRules(t)
	rdb := redistest.NewServer(t)
	rulesDir := t.TempDir()
	writeFile(t, filepath.Join(rulesDir, "edge.yaml"), edgeRules)
	serve := startServe(t, "serve", "--config", rulesDir, "--redis", rdb.URL(),
		"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--log-format", "json")
	a := startApp(t, rdb.Addr())
	rulesPath, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	prom := promtest.Start(t, []promtest.Target{{Job: "tollgate", Addr: serve.http}, {Job: "app", Addr: a.http}}, rulesPath)
	waitScraped(t, prom, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var faults sync.WaitGroup
	faults.Go(func() {
		time.Sleep(time.Second)
		writeFile(t, filepath.Join(rulesDir, "broken.yaml"), "domain: [\n") // the reload fails; edge's rules stay
		time.Sleep(500 * time.Millisecond)
		if err := rdb.Pause(); err != nil {
			t.Error(err)
			return
		}
		time.Sleep(1500 * time.Millisecond)
		if err := rdb.Resume(); err != nil {
			t.Error(err)
		}
	})
	load(ctx, t, serve, a)
	faults.Wait()
	time.Sleep(2500 * time.Millisecond) // two scrapes and rule evaluations after the load

	qctx, qcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer qcancel()
	checkNames(qctx, t, prom, d, rules)
	checkPanels(qctx, t, prom, d)
	checkRecorded(qctx, t, prom, rules)
	firing := map[string]bool{}
	alerts, err := prom.Query(qctx, `ALERTS{alertstate="firing"}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range alerts {
		firing[s.Labels["alertname"]+" "+s.Labels["job"]] = true
	}
	for _, want := range []string{"TollgateReloadFailed tollgate", "TollgateUnknownDomain tollgate"} {
		if !firing[want] {
			t.Errorf("alert %s not firing; firing: %v", want, firing)
		}
	}
	if t.Failed() {
		t.Logf("tollgate serve:\n%s\nprometheus:\n%s", serve.log.String(), prom.Log())
	}
}

// edgeRules are the decision service's rules: a token bucket per client
// address, which the load goes over, and a rule on the login path that
// fails closed.
const edgeRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 20
      algorithm: token_bucket
      burst: 10
  - key: path
    value: /login
    rate_limit:
      unit: minute
      requests_per_unit: 100000
      failure_mode: closed
`

// checkNames checks that every metric the rules and the panels name was
// scraped.
func checkNames(ctx context.Context, t *testing.T, prom *promtest.Server, d dashboard, rules []rule) {
	t.Helper()
	names, err := prom.Names(ctx)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]string{} // name: where
	for _, r := range rules {
		for _, n := range metricName.FindAllString(r.Expr, -1) {
			used[n] = "rule " + r.Alert + r.Record
		}
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, door := range d.doors(t) {
				for _, n := range metricName.FindAllString(expand(tg.Expr, door), -1) {
					used[n] = "panel " + p.Title
				}
			}
		}
	}
	for n, where := range used {
		if !slices.Contains(names, n) {
			t.Errorf("%s: %s is not a metric tollgate exports", where, n)
		}
	}
}

// checkPanels runs every query of every panel, for every value of the
// door variable the query uses.
func checkPanels(ctx context.Context, t *testing.T, prom *promtest.Server, d dashboard) {
	t.Helper()
	queries := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			doors := []string{""}
			if strings.Contains(tg.Expr, "door}") || strings.Contains(tg.Expr, "$door") {
				doors = d.doors(t)
			}
			for _, door := range doors {
				queries++
				expr := expand(tg.Expr, door)
				samples, err := prom.Query(ctx, expr)
				if err != nil {
					t.Errorf("panel %q: %v", p.Title, err)
					continue
				}
				checkSamples(t, p.Title, expr, tg.LegendFormat, samples)
			}
		}
	}
	t.Logf("%d queries of %d panels answered", queries, len(d.Panels))
}

// checkSamples checks the answer to a panel's query: series, each with the
// labels the legend names, and at least one a number.
func checkSamples(t *testing.T, panel, expr, legend string, samples []promtest.Sample) {
	t.Helper()
	if len(samples) == 0 {
		t.Errorf("panel %q: %s returns no data", panel, expr)
		return
	}
	number := false
	for _, s := range samples {
		number = number || !math.IsNaN(s.Value) && !math.IsInf(s.Value, 0)
		for _, m := range legendLabel.FindAllStringSubmatch(legend, -1) {
			if s.Labels[m[1]] == "" {
				t.Errorf("panel %q: %s: a series %v without the label %s of its legend %q", panel, expr, s.Labels, m[1], legend)
			}
		}
	}
	if !number {
		t.Errorf("panel %q: %s: no series has a number: %v", panel, expr, samples)
	}
}

// checkRecorded checks that every recording rule records series, each
// with a job, and that the middleware's carry both doors.
func checkRecorded(ctx context.Context, t *testing.T, prom *promtest.Server, rules []rule) {
	t.Helper()
	for _, r := range rules {
		if r.Record == "" {
			continue
		}
		samples, err := prom.Query(ctx, r.Record)
		if err != nil {
			t.Error(err)
			continue
		}
		doors := map[string]bool{}
		for _, s := range samples {
			if s.Labels["job"] == "" {
				t.Errorf("%s: a series without job: %v", r.Record, s.Labels)
			}
			doors[s.Labels["door"]] = true
		}
		if len(samples) == 0 {
			t.Errorf("recording rule %s records nothing", r.Record)
		}
		if strings.Contains(r.Record, "middleware") && (!doors["http"] || !doors["grpc"]) {
			t.Errorf("%s: doors %v, want http and grpc", r.Record, doors)
		}
	}
}

// waitScraped waits until Prometheus has scraped n targets successfully.
func waitScraped(t *testing.T, prom *promtest.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		up, err := prom.Query(context.Background(), "up == 1")
		if err == nil && len(up) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, up == 1 is %v (%v), want %d targets\n%s", up, err, n, prom.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func writeFile(t *testing.T, path, text string) {
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Error(err)
	}
}

// proc is a running tollgate serve: its listeners and its log.
type proc struct {
	http, grpc string
	log        *promtest.Output
}

var listening = regexp.MustCompile(`"msg":"listening","http":"([^"]+)","grpc":"([^"]+)"`)

// startServe runs the tollgate binary with args (--log-format json),
// waits until it listens, and stops it when the test ends.
func startServe(t *testing.T, args ...string) proc {
	t.Helper()
	cmd := exec.Command(tollgateBinary(t), args...)
	log := new(promtest.Output)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(log.String()); m != nil {
			return proc{http: m[1], grpc: m[2], log: log}
		}
		select {
		case err := <-done:
			t.Fatalf("tollgate %q exited: %v\n%s", args, err, log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("tollgate %q does not listen after 20s:\n%s", args, log.String())
	return proc{}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// tollgateBinary builds cmd/tollgate once for the test binary, into a
// directory TestMain removes.
func tollgateBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-promtest-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "tollgate")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/tollgate")
		cmd.Dir = filepath.Join("..", "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = err
			t.Logf("go build: %s", out)
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
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
