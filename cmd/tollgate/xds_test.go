package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/internal/test/xdstest"
)

// The tests below run the tollgate binary as Envoy Gateway runs
// envoyproxy/ratelimit, its rules pushed by a real go-control-plane
// management server that the test runs (internal/test/xdstest).

const egNode = "envoy-ratelimit"

// egRoute is the outer descriptor's key and value of Envoy Gateway's
// rules: the route's rule.
const egRoute = "httproute/default/api/rule/0"

// egDomain is a domain as Envoy Gateway pushes it: its limit on the inner
// descriptor rule-0-match-0, which has no value. Beside it, the same limit
// on a descriptor of its own, egProbe, for the tests to read the rules in
// force by (limitOf) without adding to the route's statistics.
func egDomain(name string, unit rlsconf.RateLimitUnit, perUnit uint32) *rlsconf.RateLimitConfig {
	policy := func() *rlsconf.RateLimitPolicy { return &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: perUnit} }
	return &rlsconf.RateLimitConfig{Name: name, Domain: name, Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: egRoute, Value: egRoute,
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "rule-0-match-0", RateLimit: policy()}},
	}, {Key: egProbe, RateLimit: policy()}}}
}

// egProbe is the key of the descriptor limitOf asks about.
const egProbe = "probe"

// egRequest is what Envoy asks for a request on the route of a client:
// the value of the header the rule tells clients apart by (a rule of
// Envoy Gateway's "Distinct" type), a counter each.
func egRequest(domain, client string) *pb.RateLimitRequest {
	return request(domain, desc(egRoute, egRoute, "rule-0-match-0", client))
}

// egEnv is Envoy Gateway's environment of release r for the rate limit
// service (envoyGateway), adapted to loopback ports, to certs' files and
// to Redis at redisAddr and the management server at xdsAddr.
func egEnv(certs *xdstest.Certs, redisAddr, xdsAddr string, r egRelease) []string {
	env := []string{}
	for _, kv := range envoyGateway("/certs", r) {
		name, v, _ := strings.Cut(kv, "=")
		switch {
		case name == "REDIS_URL":
			v = redisAddr
		case name == "CONFIG_GRPC_XDS_SERVER_URL":
			v = xdsAddr
		case name == "PROMETHEUS_ADDR":
			v = "127.0.0.1:0"
		case strings.HasSuffix(v, "/tls.crt"):
			v = certs.ClientCert
		case strings.HasSuffix(v, "/tls.key"):
			v = certs.ClientKey
		case strings.HasSuffix(v, "/ca.crt"):
			v = certs.CA
		}
		env = append(env, name+"="+v)
	}
	return append(env, "HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0")
}

// egCreds is how Envoy reaches the rate limit service of Envoy Gateway:
// TLS, trusting the CA, with a client certificate of its own.
func egCreds(t *testing.T, certs *xdstest.Certs) grpc.DialOption {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}, RootCAs: roots, ServerName: "localhost"}))
}

// limitOf is the requests_per_unit of the rule of egProbe in domain, -1
// when the answer carries no current_limit (no rule), -2 when the request
// fails (no rules yet).
func limitOf(p *proc, domain string) int {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := p.rls.ShouldRateLimit(ctx, request(domain, desc(egProbe, "p")))
	if err != nil {
		return -2
	}
	l := resp.GetStatuses()[0].GetCurrentLimit()
	if l == nil {
		return -1
	}
	return int(l.GetRequestsPerUnit())
}

// egRefused pushes a snapshot the loader refuses and wants it NACKed with
// the loader's message while the rules in force stay and are applied, and
// the resends that follow answered without a flood of NACKs or log lines.
func egRefused(t *testing.T, p *proc, mgmt *xdstest.Server) {
	t.Helper()
	before := len(mgmt.Requests())
	failures := p.metric(`tollgate_serve_config_reloads_total{result="failure"}`)
	mgmt.Push(t, egNode, "4", egDomain("default/eg/grpc", rlsconf.RateLimitUnit_UNKNOWN, 1))
	want := `config: default/eg/grpc:3:50: invalid rate limit unit "UNKNOWN"`
	testkit.Eventually(t, "a NACK with the loader's message", func() bool {
		rs := mgmt.Requests()
		return len(rs) > before && strings.Contains(rs[len(rs)-1].Error, want)
	})
	start := time.Now()
	for time.Since(start) < time.Second {
		if got := limitOf(p, "default/eg/grpc"); got != 7 {
			t.Fatalf("while the refused snapshot is resent: limit %d, want 7, the rules in force", got)
		}
	}
	nacks := 0
	for _, r := range mgmt.Requests()[before:] {
		if r.Error != "" {
			nacks++
		}
	}
	if nacks > 30 {
		t.Errorf("%d NACKs of one snapshot in about a second, want about ten", nacks)
	}
	if got := p.metric(`tollgate_serve_config_reloads_total{result="failure"}`) - failures; got < 2 {
		t.Errorf("%v refusals counted, want every resend refused", got)
	}
	if got := len(regexp.MustCompile(`rules not loaded`).FindAllString(p.log.String(), -1)); got != 1 {
		t.Errorf("%d log lines for %d refusals of one snapshot, want 1", got, nacks)
	}
	t.Logf("%d NACKs of one refused snapshot in %v", nacks, time.Since(start).Round(time.Millisecond))
}

// TestServeXDSWaitsForFirstRules starts tollgate with rules over xDS and
// without FORCE_START_WITHOUT_INITIAL_CONFIG, in plaintext with headers:
// as envoy, it listens only once the first response is handled. The
// headers reach the management server and never the log, even at debug
// level.
func TestServeXDSWaitsForFirstRules(t *testing.T) {
	t.Parallel()
	mgmt := xdstest.Start(t, nil)
	p := spawnEnv(t, []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + mgmt.Addr, "CONFIG_GRPC_XDS_NODE_ID=" + egNode,
		"CONFIG_GRPC_XDS_NODE_METADATA=cluster=eg,zone:a", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer s3cr3t,x-tenant:t1",
		"LOG_LEVEL=debug", "USE_STATSD=false", "HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0"})
	p.log.waitFor(t, regexp.MustCompile(`waiting for the first response`), 20*time.Second)
	testkit.Eventually(t, "the stream opened", func() bool { _, n := mgmt.Headers(); return n > 0 })
	if listening.MatchString(p.log.String()) {
		t.Fatalf("listening before any response:\n%s", p.log.String())
	}
	mgmt.Push(t, egNode, "1", egDomain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 3))
	p.awaitListening(grpc.WithTransportCredentials(insecure.NewCredentials()))
	if got := limitOf(p, "default/eg/http"); got != 3 {
		t.Errorf("limit %d, want 3", got)
	}
	md, _ := mgmt.Headers()
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer s3cr3t" {
		t.Errorf("authorization at the management server: %q", got)
	}
	if got := mgmt.Requests()[0].Node.GetMetadata().GetFields(); len(got) != 1 || got["cluster"].GetStringValue() != "eg" {
		t.Errorf("node metadata %v, want cluster=eg alone (zone:a has no '=')", got)
	}
	if log := p.log.String(); strings.Contains(log, "s3cr3t") || !strings.Contains(log, `headers=authorization,x-tenant`) {
		t.Errorf("the log shows the header's value, or not the headers' names:\n%s", log)
	}
}

// egHostile pushes snapshots past the loader's bounds, a huge one and a
// deeply nested one, and wants each NACKed with the loader's message and
// the rules in force kept.
func egHostile(t *testing.T, p *proc, mgmt *xdstest.Server) {
	t.Helper()
	huge := egDomain("default/eg/grpc", rlsconf.RateLimitUnit_SECOND, 8)
	for i := range 40 {
		huge.Descriptors = append(huge.Descriptors, &rlsconf.RateLimitDescriptor{Key: "k", Value: fmt.Sprint(i, strings.Repeat("v", 30<<10))})
	}
	deep := &rlsconf.RateLimitDescriptor{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1}}
	for range 1000 {
		deep = &rlsconf.RateLimitDescriptor{Key: "k", Descriptors: []*rlsconf.RateLimitDescriptor{deep}}
	}
	for i, tc := range []struct {
		name   string
		config *rlsconf.RateLimitConfig
		want   string
	}{
		{"huge", huge, "config: default/eg/grpc: larger than the limit of 1048576 bytes"},
		{"deep", &rlsconf.RateLimitConfig{Name: "default/eg/grpc", Domain: "default/eg/grpc", Descriptors: []*rlsconf.RateLimitDescriptor{deep}},
			"config: default/eg/grpc:17:29: descriptors nested deeper than 16 levels (the limit)"},
	} {
		mgmt.Push(t, egNode, fmt.Sprint("hostile-", i), tc.config)
		testkit.Eventually(t, tc.name+": a NACK with the loader's message", func() bool {
			rs := mgmt.Requests()
			return strings.Contains(rs[len(rs)-1].Error, tc.want)
		})
		if got := limitOf(p, "default/eg/grpc"); got != 7 {
			t.Errorf("%s: limit %d, want 7, the rules in force", tc.name, got)
		}
	}
}
