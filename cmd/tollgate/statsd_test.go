package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The tests below run tollgate with Envoy Gateway's environments for its
// statistics: v1.0–v1.1, statsd into a prom/statsd-exporter sidecar with
// Envoy Gateway's mapping; v1.2 and later, the same mapping applied in
// process (PROMETHEUS_MAPPER_YAML). The sidecar is a real statsd_exporter
// of the version Envoy Gateway runs, built from its Go module by the test.

// statsdExporterVersion is the prom/statsd-exporter image Envoy Gateway
// v1.0–v1.1 runs beside the rate limit service.
const statsdExporterVersion = "v0.18.0"

// egMapping is Envoy Gateway's mapping, v1.0 to v1.2.
var egMapping, _ = filepath.Abs("../../internal/service/statsd/testdata/envoy-gateway-v1.0-v1.2.yaml")

var (
	exporterOnce sync.Once
	exporterBin  string
	exporterErr  error
)

// statsdExporterBinary builds statsd_exporter once, with go install, into
// a directory TestMain removes with the tollgate binary's.
func statsdExporterBinary(t *testing.T) string {
	t.Helper()
	exporterOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-statsd-exporter-")
		if err != nil {
			exporterErr = err
			return
		}
		extraTempDirs = append(extraTempDirs, dir)
		cmd := exec.Command("go", "install", "github.com/prometheus/statsd_exporter@"+statsdExporterVersion)
		cmd.Dir = dir // outside this module: its own go.mod decides
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			exporterErr = fmt.Errorf("go install statsd_exporter@%s: %v\n%s", statsdExporterVersion, err, out)
			return
		}
		exporterBin = filepath.Join(dir, "statsd_exporter")
	})
	if exporterErr != nil {
		t.Fatal(exporterErr)
	}
	return exporterBin
}

// exporter is a running statsd_exporter.
type exporter struct {
	statsd string // host:port, TCP and UDP
	web    string // base URL
}

// startStatsdExporter runs statsd_exporter with mapping on free loopback
// ports, and waits until it answers.
func startStatsdExporter(t *testing.T, mapping string) *exporter {
	t.Helper()
	bin := statsdExporterBinary(t)
	port := freeTCPUDPPort(t)
	web := freeTCPUDPPort(t)
	e := &exporter{statsd: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), web: "http://127.0.0.1:" + strconv.Itoa(web)}
	cmd := exec.Command(bin, "--statsd.listen-tcp="+e.statsd, "--statsd.listen-udp="+e.statsd,
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(web), "--statsd.mapping-config="+mapping)
	log := &logBuffer{added: make(chan struct{}, 1)}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("statsd_exporter log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(e.web + "/metrics")
		if err == nil {
			resp.Body.Close()
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("statsd_exporter does not answer: %v\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeTCPUDPPort is a loopback port free for TCP and UDP alike.
func freeTCPUDPPort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", l.Addr().String())
		l.Close()
		if err == nil {
			pc.Close()
			return port
		}
	}
	t.Fatal("no loopback port free for TCP and UDP")
	return 0
}

// scrape reads a Prometheus text exposition into name{labels} → value,
// for the series whose names match re.
func scrape(t *testing.T, url string, re *regexp.Regexp) map[string]float64 {
	t.Helper()
	code, body := getURL(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d", url, code)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		name := line[:i]
		if n, _, _ := strings.Cut(name, "{"); !re.MatchString(n) {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", url, line, err)
		}
		out[name] = v
	}
	return out
}

// waitSeries waits until the series at url matching re include want (name
// → value), and returns them all.
func waitSeries(t *testing.T, url string, re *regexp.Regexp, want map[string]float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := scrape(t, url, re)
		missing := 0
		for k, v := range want {
			if got[k] != v {
				missing++
			}
		}
		if missing == 0 {
			return got
		}
		if time.Now().After(deadline) {
			var lines []string
			for k, v := range want {
				lines = append(lines, fmt.Sprintf("%s = %v, want %v", k, got[k], v))
			}
			slices.Sort(lines)
			t.Fatalf("%s: after 15s:\n%s\nall:\n%v", url, strings.Join(lines, "\n"), got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// egRules are rules as Envoy Gateway pushes them: the domain holds '/', the
// outer descriptor's key and value are the route's name, the inner one,
// without a value, carries the limit; and one rule of one descriptor.
const egRules = `domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0
    value: httproute/default/backend/rule/0/match/0
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`

const egStatsRoute = "httproute/default/backend/rule/0/match/0"

// egTraffic sends p the same requests each test sends: five of the route
// (three within its limit of 3, the third near it, two over), one of a
// user, one of a domain without rules, and one without a domain. It
// returns how many ShouldRateLimit calls it made.
func egTraffic(t *testing.T, p *proc) int {
	t.Helper()
	for i, want := range []string{"OK: OK", "OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT", "OVER_LIMIT: OVER_LIMIT"} {
		r := p.ask(request("default/eg/http", desc(egStatsRoute, egStatsRoute, "rule-0-match-0", "")))
		if got := codesOf(r); got != want {
			t.Fatalf("route request %d: %s, want %s", i+1, got, want)
		}
	}
	p.ask(request("default/eg/http", desc("user", "alice")))
	p.ask(request("nowhere", desc("user", "alice")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.rls.ShouldRateLimit(ctx, &pb.RateLimitRequest{}); err == nil {
		t.Fatal("a request without a domain is answered")
	}
	return 8
}

// egWant is what Envoy Gateway reads after egTraffic, through its mapping.
func egWant(calls int) map[string]float64 {
	route := `domain="default/eg/http",key1="` + egStatsRoute + "_" + egStatsRoute + `",key2="rule-0-match-0"`
	return map[string]float64{
		"ratelimit_service_rate_limit_total_hits{" + route + "}":                          5,
		"ratelimit_service_rate_limit_within_limit{" + route + "}":                        3,
		"ratelimit_service_rate_limit_near_limit{" + route + "}":                          1,
		"ratelimit_service_rate_limit_over_limit{" + route + "}":                          2,
		`ratelimit_service_rate_limit_total_hits{domain="default/eg/http",key1="user"}`:   1,
		`ratelimit_service_rate_limit_within_limit{domain="default/eg/http",key1="user"}`: 1,
		`ratelimit_service_config_load_success`:                                           1,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`:                 float64(calls),
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}`:    float64(calls),
		`ratelimit_service_should_rate_limit_error{err_type="service_error"}`:             1,
	}
}

// ratelimitSeries are the series Envoy Gateway reads: ratelimit_*.
var ratelimitSeries = regexp.MustCompile(`^ratelimit_`)

// checkOnly fails for every series of got outside want, but the response
// time histogram's buckets and sum.
func checkOnly(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for k := range got {
		if _, ok := want[k]; ok || strings.HasPrefix(k, "ratelimit_service_response_time_seconds_") {
			continue
		}
		t.Errorf("%s = %v: a series envoy's statistics do not make through the mapping", k, got[k])
	}
}

// egV11Env is Envoy Gateway v1.0–v1.1's environment for the rate limit
// container's statistics, on loopback, flushing every 200 ms, with rules
// from a runtime tree rather than over xDS.
func egV11Env(root, statsdAddr string, more ...string) []string {
	host, port, _ := net.SplitHostPort(statsdAddr)
	return statsEnv(root, append([]string{"USE_STATSD=true", "STATSD_HOST=" + host, "STATSD_PORT=" + port}, more...)...)
}

// statsEnv is composeEnv without Redis (the memory store decides), with
// statistics flushed every 200 ms, and more.
func statsEnv(root string, more ...string) []string {
	env := slices.DeleteFunc(composeEnv("", root), func(kv string) bool {
		return strings.HasPrefix(kv, "REDIS_") || kv == "USE_STATSD=false"
	})
	return append(append(env, "STATS_FLUSH_INTERVAL=200ms"), more...)
}

// TestStatsdExporterSidecar: Envoy Gateway v1.0–v1.1's layout. tollgate
// sends statsd to a statsd_exporter with Envoy Gateway's mapping, which
// then shows the series Envoy Gateway reads, with envoy's values; a rules
// load that fails shows as config_load_error.
func TestStatsdExporterSidecar(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"tcp", "udp"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			ex := startStatsdExporter(t, egMapping)
			root := runtimeTree(t, egRules)
			p := startEnv(t, egV11Env(root, ex.statsd, "STATSD_PROTOCOL="+protocol))
			calls := egTraffic(t, p)
			want := egWant(calls)
			got := waitSeries(t, ex.web+"/metrics", ratelimitSeries, want)
			checkOnly(t, got, want)

			// The rules are watched: a change that does not load is an error
			// (or two: a write may be seen twice).
			writeFile(t, filepath.Join(root, "ratelimit", "config", "config.yaml"), "domain: d\ndescriptors: [{key: k, rate_limit: {unit: UNKNOWN, requests_per_unit: 1}}]\n")
			deadline := time.Now().Add(15 * time.Second)
			for scrape(t, ex.web+"/metrics", ratelimitSeries)["ratelimit_service_config_load_error"] < 1 {
				if time.Now().After(deadline) {
					t.Fatal("no ratelimit_service_config_load_error after rules that do not load")
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// TestStatsdMapperInProcess: Envoy Gateway v1.2 and later. The same
// mapping, as PROMETHEUS_MAPPER_YAML, shows the same series on
// PROMETHEUS_ADDR, in place of tollgate's own
// ratelimit_service_rate_limit_*.
func TestStatsdMapperInProcess(t *testing.T) {
	t.Parallel()
	root := runtimeTree(t, egRules)
	p := startEnv(t, statsEnv(root, "USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0",
		"PROMETHEUS_MAPPER_YAML="+egMapping))
	addr := p.log.waitFor(t, regexp.MustCompile(`msg="prometheus listening" addr=(\S+)`), 5*time.Second)[1]
	calls := egTraffic(t, p)
	want := egWant(calls)
	got := waitSeries(t, "http://"+addr+"/metrics", ratelimitSeries, want)
	checkOnly(t, got, want)
	// The HTTP listener's /metrics shows the same registry.
	if _, body := p.get("/metrics"); !strings.Contains(body, `ratelimit_service_config_load_success 1`) {
		t.Error("/metrics of the HTTP listener lacks the mapped series")
	}
}

// TestStatsdBound: the names callers' values make (a detailed_metric
// rule's client addresses, descriptors' own limits with long values) are
// bounded: the first 1,000 are series of their own, the rest are counted
// under __overflow__, and tollgate_serve_metric_names_folded_total counts
// them.
func TestStatsdBound(t *testing.T) {
	t.Parallel()
	root := runtimeTree(t, "domain: d\ndescriptors:\n  - key: remote_address\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 100}\n")
	p := startEnv(t, statsEnv(root, "USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0",
		"PROMETHEUS_MAPPER_YAML="+egMapping))
	addr := p.log.waitFor(t, regexp.MustCompile(`msg="prometheus listening" addr=(\S+)`), 5*time.Second)[1]
	const clients = 1010
	for i := range clients {
		p.ask(request("d", desc("remote_address", fmt.Sprintf("10.0.%d.%d", i/250, i%250))))
	}
	long := strings.Repeat("v", 900)
	body := `{"domain":"d","descriptors":[`
	for i := range 3 {
		if i > 0 {
			body += ","
		}
		body += fmt.Sprintf(`{"entries":[{"key":"k","value":"%s%d"}],"limit":{"requests_per_unit":5,"unit":"MINUTE"}}`, long, i)
	}
	if code, out := postJSON(t, p.http+"/json", body+`]}`); code != http.StatusOK {
		t.Fatalf("/json: %d %s", code, out)
	}
	got := waitSeries(t, "http://"+addr+"/metrics", regexp.MustCompile(`^(ratelimit_service_rate_limit_total_hits|tollgate_serve_metric_names_folded_total)$`), map[string]float64{
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="__overflow__"}`: clients - 1000 + 3,
		`tollgate_serve_metric_names_folded_total{reason="too_many"}`:             clients - 1000,
		`tollgate_serve_metric_names_folded_total{reason="too_long"}`:             3,
	})
	// A scrape under load has shown the overflow's count complete while
	// some clients' series were still missing: wait for those too.
	own := func(got map[string]float64) (n int) {
		for k := range got {
			if strings.Contains(k, `key1="remote_address_`) {
				n++
			}
			if strings.Contains(k, long) {
				t.Fatalf("a series named after a 900-byte value: %.80s…", k)
			}
		}
		return n
	}
	for deadline := time.Now().Add(15 * time.Second); own(got) < 1000 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		got = scrape(t, "http://"+addr+"/metrics", regexp.MustCompile(`^ratelimit_service_rate_limit_total_hits$`))
	}
	if n := own(got); n != 1000 {
		t.Errorf("%d client addresses with series of their own, want 1000", n)
	}
}
