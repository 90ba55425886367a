package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/internal/test/xdstest"
)

// TestEnvoyGateway runs the tollgate binary as Envoy Gateway runs
// envoyproxy/ratelimit: as /bin/ratelimit, with the whole environment of
// Envoy Gateway's Deployment, adapted only to loopback ports and to
// temporary certificates, and one argument Envoy Gateway does not give,
// --timeout 5s, so that a Redis call slower than the default 50 ms on a
// busy machine is not answered by the failure mode; its rules pushed over mTLS
// by a go-control-plane management server, its statistics read through
// Envoy Gateway's mapping. Each layout follows a snapshot's life — a
// forced start, decisions over mTLS, an update, a domain removed, refused
// snapshots, the management server restarted with versions from "1" — and
// then wants the series envoy's statistics make through the mapping for
// the same requests. Statistics are flushed every 200 ms (envoy's
// STATS_FLUSH_INTERVAL, not one of Envoy Gateway's variables); the wait to
// reconnect to the restarted management server is envoy's default, 10 s
// ± 50%, and takes most of the test's time.
func TestEnvoyGateway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		release egRelease
		mapping string
	}{
		{"v1.1.1 statsd sidecar", egV111, egMapping},
		{"v1.2 mapping in process", egV12, egMapping},
		{"v1.3 mapping in process", egV12, egMappingV13},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runEnvoyGateway(t, tc.release, tc.mapping)
		})
	}
}

// egMappingV13 is Envoy Gateway's mapping from v1.3 on.
var egMappingV13 = strings.Replace(egMapping, "v1.0-v1.2", "v1.3", 1)

// egCalls counts the test's ShouldRateLimit calls, and those that failed:
// what envoy's total_requests and service_error count.
type egCalls struct{ all, failed atomic.Int64 }

func (c *egCalls) interceptor() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/ShouldRateLimit") {
			c.all.Add(1)
			if err != nil {
				c.failed.Add(1)
			}
		}
		return err
	})
}

func runEnvoyGateway(t *testing.T, release egRelease, mapping string) {
	rdb := redistest.NewServer(t)
	certs := xdstest.NewCerts(t)
	mgmt := xdstest.Start(t, certs)
	env := append(egEnv(certs, rdb.Addr(), mgmt.Addr, release), "STATS_FLUSH_INTERVAL=200ms")
	var metrics string
	if release == egV111 {
		ex := startStatsdExporter(t, mapping)
		_, port, _ := net.SplitHostPort(ex.statsd)
		env = setEnv(env, "STATSD_PORT", port) // STATSD_HOST stays unset: localhost
		metrics = ex.web + "/metrics"
	} else {
		env = setEnv(env, "PROMETHEUS_MAPPER_YAML", mapping)
	}
	p := spawnRatelimit(t, env, "--timeout", "5s")
	var calls egCalls
	p.awaitListening(egCreds(t, certs), calls.interceptor())
	if metrics == "" {
		metrics = "http://" + p.log.waitFor(t, regexp.MustCompile(`msg="prometheus listening" addr=(\S+)`), 5*time.Second)[1] + "/metrics"
	}

	egBeforeRules(t, p)
	egCertless(t, p, certs, &calls)
	mgmt.Push(t, egNode, "1", egDomain("default/eg/http", rlsconf.RateLimitUnit_HOUR, 3), egDomain("default/eg/grpc", rlsconf.RateLimitUnit_SECOND, 7))
	testkit.Eventually(t, "the first push in force", func() bool { return limitOf(p, "default/eg/http") == 3 })
	client := "c-" + randomID()
	for i, want := range []string{"OK: OK", "OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
		if got := codesOf(p.ask(egRequest("default/eg/http", client))); got != want {
			t.Errorf("request %d over mTLS: %s, want %s", i+1, got, want)
		}
	}
	mgmt.Push(t, egNode, "2", egDomain("default/eg/http", rlsconf.RateLimitUnit_HOUR, 5), egDomain("default/eg/grpc", rlsconf.RateLimitUnit_SECOND, 7))
	testkit.Eventually(t, "the update in force", func() bool { return limitOf(p, "default/eg/http") == 5 })
	mgmt.Push(t, egNode, "3", egDomain("default/eg/grpc", rlsconf.RateLimitUnit_SECOND, 7))
	testkit.Eventually(t, "the domain left out deleted", func() bool { return limitOf(p, "default/eg/http") == -1 })
	if got := codesOf(p.ask(egRequest("default/eg/http", client))); got != "OK: OK" {
		t.Errorf("a request of the deleted domain: %s, want OK: OK", got)
	}
	egRefused(t, p, mgmt)
	egHostile(t, p, mgmt)

	mgmt.Restart(t)
	restarted := time.Now()
	p.log.waitFor(t, regexp.MustCompile(`xDS: no stream to the management server; reconnecting`), 10*time.Second)
	if got := limitOf(p, "default/eg/grpc"); got != 7 {
		t.Errorf("while the management server is away: limit %d, want 7, the rules in force", got)
	}
	if code, _ := p.get("/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck while the management server is away: %d, want 200", code)
	}
	mgmt.Push(t, egNode, "1", egDomain("default/eg/http", rlsconf.RateLimitUnit_HOUR, 13))
	testkit.Eventually(t, `version "1" of the restarted server in force`, func() bool { return limitOf(p, "default/eg/http") == 13 })
	t.Logf("the restarted server's rules in force %v after it started", time.Since(restarted).Round(time.Millisecond))
	if got := limitOf(p, "default/eg/grpc"); got != -1 {
		t.Errorf("default/eg/grpc after the restart's snapshot: limit %d, want none", got)
	}
	egSeries(t, metrics, mapping == egMappingV13, &calls)
}

// egBeforeRules checks what a forced start answers before any rules, as
// envoy: alive to Envoy Gateway's probes, not ready, requests failing.
func egBeforeRules(t *testing.T, p *proc) {
	t.Helper()
	if code, _ := p.get("/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck before any rules: %d, want 200", code)
	}
	if code, body := p.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no rules loaded") {
		t.Errorf("/readyz before any rules: %d %q, want 503 no rules loaded", code, body)
	}
	_, err := p.rls.ShouldRateLimit(context.Background(), egRequest("default/eg/http", "c1"))
	if status.Code(err) != codes.Unknown || status.Convert(err).Message() != "no rate limit configuration loaded" {
		t.Errorf("ShouldRateLimit before any rules: %v, want Unknown: no rate limit configuration loaded", err)
	}
}

// egCertless checks that a TLS client without a certificate is served, as
// by envoy: Envoy Gateway sets GRPC_SERVER_TLS_CA_CERT, which envoy does
// not read, and not GRPC_CLIENT_TLS_CACERT, which would ask for one.
func egCertless(t *testing.T, p *proc, certs *xdstest.Certs, calls *egCalls) {
	t.Helper()
	pem, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost"})), calls.interceptor())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Before the rules, the call fails as every call does then; over TLS
	// it got that far.
	_, err = pb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), egRequest("default/eg/http", "c1"))
	if status.Code(err) != codes.Unknown {
		t.Errorf("a TLS client without a certificate: %v, want served (Unknown: no rate limit configuration loaded)", err)
	}
}

// egSeries waits for the series envoy's statistics make through Envoy
// Gateway's mapping at url (v13: v1.3's, which drops nothing), after
// runEnvoyGateway's requests, calls of them, and fails for any other.
func egSeries(t *testing.T, url string, v13 bool, calls *egCalls) {
	t.Helper()
	route := `domain="default/eg/http",key1="` + egRoute + "_" + egRoute + `",key2="rule-0-match-0"`
	n := float64(calls.all.Load())
	want := map[string]float64{
		"ratelimit_service_rate_limit_total_hits{" + route + "}":                       4,
		"ratelimit_service_rate_limit_within_limit{" + route + "}":                     3,
		"ratelimit_service_rate_limit_near_limit{" + route + "}":                       1,
		"ratelimit_service_rate_limit_over_limit{" + route + "}":                       1,
		`ratelimit_service_config_load_success`:                                        4,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`:              n,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}`: n,
		`ratelimit_service_should_rate_limit_error{err_type="service_error"}`:          float64(calls.failed.Load()),
	}
	got := waitSeries(t, url, ratelimitSeries, want)
	// Passed through by v1.3's mapping: one connection to Redis at least.
	if v13 && (got["ratelimit_redis_pool_cx_active"] < 1 || got["ratelimit_redis_pool_cx_total"] < got["ratelimit_redis_pool_cx_active"]) {
		t.Errorf("Redis pool: %v connections open, %v opened; want 1 or more, and as many or more", got["ratelimit_redis_pool_cx_active"], got["ratelimit_redis_pool_cx_total"])
	}
	if e := got["ratelimit_service_config_load_error"]; e < 3 {
		t.Errorf("ratelimit_service_config_load_error = %v, want 3 or more (a refused snapshot, resent, and two hostile ones)", e)
	}
	for k, v := range got {
		switch {
		case want[k] != 0, k == "ratelimit_service_config_load_error", v13 && strings.HasPrefix(k, "ratelimit_redis_pool_"),
			strings.HasPrefix(k, "ratelimit_service_response_time_seconds"),
			strings.Contains(k, `key1="`+egProbe+`"`): // limitOf's
		case v13 && (strings.HasPrefix(k, "ratelimit_go_") || strings.HasSuffix(k, "_domain_not_found")):
			// Passed through by v1.3's mapping, as envoy's are.
		default:
			t.Errorf("%s = %v: a series envoy's statistics do not make through the mapping", k, v)
		}
	}
}

// spawnRatelimit runs the tollgate binary as /bin/ratelimit, envoy's
// path, with args (Envoy Gateway gives none) and no environment but env:
// as Envoy Gateway runs the rate limit container.
func spawnRatelimit(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(tollgateBinary(t))
	cmd.Args = append([]string{"/bin/ratelimit"}, args...)
	return spawnCmd(t, cmd, env)
}

// setEnv sets name in env to v.
func setEnv(env []string, name, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			env[i] = name + "=" + v
			return env
		}
	}
	return append(env, name+"="+v)
}
