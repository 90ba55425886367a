package xds_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/xds"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/internal/test/xdstest"
	"github.com/tollgate/tollgate/memorystore"
)

const node = "envoy-ratelimit"

// route is the outer descriptor's key and value as Envoy Gateway names
// them: the route's rule.
const route = "httproute/default/api/rule/0"

// domain is one of Envoy Gateway's: as it pushes it, with its limit on
// rule-0-match-0, which has no value.
func domain(name string, unit rlsconf.RateLimitUnit, perUnit uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: name, Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: route, Value: route,
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "rule-0-match-0", RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: perUnit}}},
	}}}
}

// request is what Envoy asks for a request on the route, in domain d.
func request(d string) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: d, Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
		{Key: route, Value: route}, {Key: "rule-0-match-0", Value: "rule-0-match-0"}}}}}
}

// limitOf is the requests_per_unit a request in d is answered with, or
// -1 when the answer carries no current_limit (no rule).
func limitOf(t testing.TB, s *service.Server, d string) int {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), request(d))
	if err != nil {
		return -2
	}
	l := resp.GetStatuses()[0].GetCurrentLimit()
	if l == nil {
		return -1
	}
	return int(l.GetRequestsPerUnit())
}

// logBuffer is a log sink for the client's and the server's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// follow runs a client of srv over mTLS until the test ends, for a
// service.Server it returns.
func follow(t *testing.T, srv *xdstest.Server, certs *xdstest.Certs, log *logBuffer) (*service.Server, *xds.Client) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := service.New(memorystore.New(), service.WithLogger(logger), service.WithLogInterval(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c, err := xds.New(xds.Config{
		Server: srv.Addr, NodeID: node, NodeMetadata: map[string]string{"cluster": "eg"},
		Headers: map[string]string{"authorization": "Bearer s3cr3t-t0ken"},
		TLS:     &xds.TLSFiles{Cert: certs.ClientCert, Key: certs.ClientKey, CA: certs.CA, ServerName: certs.ServerName},
		Backoff: xds.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		Log:     logger, LogEvery: time.Minute,
	}, s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, c
}

// TestFollowsManagementServer runs the client against go-control-plane's
// server over mTLS, through a snapshot's life as Envoy Gateway leads it:
// the first push, an update, a domain removed, a refused snapshot and the
// storm of resends that follows, a fix, and a restart of the server that
// numbers its versions from "1" again.
func TestFollowsManagementServer(t *testing.T) {
	t.Parallel()
	certs := xdstest.NewCerts(t)
	srv := xdstest.Start(t, certs)
	var log logBuffer
	s, c := follow(t, srv, certs, &log)

	srv.Push(t, node, "1", domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 3), domain("default/eg/grpc", rlsconf.RateLimitUnit_SECOND, 7))
	<-c.FirstResponse()
	testkit.Eventually(t, "the first push in force", func() bool { return limitOf(t, s, "default/eg/http") == 3 && limitOf(t, s, "default/eg/grpc") == 7 })
	md, _ := srv.Headers()
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer s3cr3t-t0ken" {
		t.Errorf("the stream's authorization header = %q, want the configured one", got)
	}
	testkit.Eventually(t, "an ACK of version 1", func() bool { return lastRequest(srv).Version == "1" && lastRequest(srv).Error == "" })
	if n := lastRequest(srv).Node; n.GetId() != node || n.GetMetadata().GetFields()["cluster"].GetStringValue() != "eg" {
		t.Errorf("node %v, want id %s with metadata cluster=eg", n, node)
	}

	srv.Push(t, node, "2", domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 5), domain("default/eg/grpc", rlsconf.RateLimitUnit_SECOND, 7))
	testkit.Eventually(t, "the update in force", func() bool { return limitOf(t, s, "default/eg/http") == 5 })

	srv.Push(t, node, "3", domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 5))
	testkit.Eventually(t, "the domain left out deleted", func() bool { return limitOf(t, s, "default/eg/grpc") == -1 })

	refusedStorm(t, srv, s, &log)

	srv.Push(t, node, "5", domain("default/eg/http", rlsconf.RateLimitUnit_HOUR, 11))
	testkit.Eventually(t, "the fix in force", func() bool { return limitOf(t, s, "default/eg/http") == 11 })

	srv.Restart(t)
	srv.Push(t, node, "1", domain("default/eg/http", rlsconf.RateLimitUnit_HOUR, 13))
	testkit.Eventually(t, `version "1" again, after the restart, in force`, func() bool { return limitOf(t, s, "default/eg/http") == 13 })
	if _, streams := srv.Headers(); streams != 1 {
		t.Errorf("%d streams on the restarted server, want 1", streams)
	}

	if strings.Contains(log.String(), "s3cr3t") {
		t.Errorf("the header's value is in the log:\n%s", log.String())
	}
}

func lastRequest(srv *xdstest.Server) xdstest.Request {
	rs := srv.Requests()
	if len(rs) == 0 {
		return xdstest.Request{}
	}
	return rs[len(rs)-1]
}

// refusedStorm pushes a snapshot the loader refuses (unit UNKNOWN) and
// wants it NACKed with the loader's message, the rules in force kept, and
// go-control-plane's answer — the same snapshot again at once, after every
// NACK — neither spinning nor flooding the log, while requests are
// answered.
func refusedStorm(t *testing.T, srv *xdstest.Server, s *service.Server, log *logBuffer) {
	t.Helper()
	before := len(srv.Requests())
	srv.Push(t, node, "4", domain("default/eg/http", rlsconf.RateLimitUnit_UNKNOWN, 1))
	want := `config: default/eg/http:3:50: invalid rate limit unit "UNKNOWN"`
	testkit.Eventually(t, "a NACK with the loader's message", func() bool { return strings.Contains(lastRequest(srv).Error, want) })
	if got := lastRequest(srv).Version; got != "3" {
		t.Errorf("the NACK says version %q, want the last accepted, 3", got)
	}
	start := time.Now()
	for time.Since(start) < time.Second {
		if got := limitOf(t, s, "default/eg/http"); got != 5 {
			t.Fatalf("during the storm a request is answered with limit %d, want 5 (the rules in force)", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	nacks := 0
	for _, r := range srv.Requests()[before:] {
		if r.Error != "" {
			nacks++
		}
	}
	elapsed := time.Since(start).Seconds() + 0.5
	if nacks < 2 || float64(nacks) > 20*elapsed {
		t.Errorf("%d NACKs in %.1f s: want the resends answered, about ten a second", nacks, elapsed)
	}
	if got := strings.Count(log.String(), "rules not loaded"); got != 1 {
		t.Errorf("%d log lines for %d refusals of one snapshot, want 1", got, nacks)
	}
	t.Logf("%d NACKs of one refused snapshot in %.1f s", nacks, elapsed)
}

// TestHostileSnapshots pushes snapshots past the loader's bounds and wants
// each NACKed with the loader's message, the rules in force kept; and one
// past the largest message, which gRPC refuses before the loader sees it,
// to leave the rules in force too.
func TestHostileSnapshots(t *testing.T) {
	t.Parallel()
	certs := xdstest.NewCerts(t)
	srv := xdstest.Start(t, certs)
	var log logBuffer
	s, _ := follow(t, srv, certs, &log)
	srv.Push(t, node, "1", domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 3))
	testkit.Eventually(t, "the first push in force", func() bool { return limitOf(t, s, "default/eg/http") == 3 })

	huge := domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 4)
	for i := range 40 {
		huge.Descriptors = append(huge.Descriptors, &rlsconf.RateLimitDescriptor{Key: "k", Value: fmt.Sprint(i, strings.Repeat("v", 30<<10))})
	}
	deep := &rlsconf.RateLimitDescriptor{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: 1, RequestsPerUnit: 1}}
	for range 40 {
		deep = &rlsconf.RateLimitDescriptor{Key: "k", Descriptors: []*rlsconf.RateLimitDescriptor{deep}}
	}
	many := make([]*rlsconf.RateLimitConfig, 257)
	for i := range many {
		many[i] = domain(fmt.Sprint("default/eg/", i), rlsconf.RateLimitUnit_MINUTE, 4)
	}
	for i, tc := range []struct {
		name    string
		configs []*rlsconf.RateLimitConfig
		want    string
	}{
		{"huge", []*rlsconf.RateLimitConfig{huge}, "config: default/eg/http: larger than the limit of 1048576 bytes"},
		{"deep", []*rlsconf.RateLimitConfig{domain("default/eg/http", 2, 4), {Name: "deep", Domain: "deep", Descriptors: []*rlsconf.RateLimitDescriptor{deep}}},
			"config: deep:17:29: descriptors nested deeper than 16 levels (the limit)"},
		{"many", many, "config: 257 sources, more than the limit of 256"},
	} {
		srv.Push(t, node, fmt.Sprint(i+2), tc.configs...)
		testkit.Eventually(t, tc.name+": a NACK with the loader's message", func() bool { return strings.Contains(lastRequest(srv).Error, tc.want) })
		if got := limitOf(t, s, "default/eg/http"); got != 3 {
			t.Errorf("%s: the limit in force is %d, want 3 still", tc.name, got)
		}
	}

	overMessage := domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 4)
	for i := range 160 {
		overMessage.Descriptors = append(overMessage.Descriptors, &rlsconf.RateLimitDescriptor{Key: "k", Value: fmt.Sprint(i, strings.Repeat("v", 30<<10))})
	}
	srv.Push(t, node, "9", overMessage)
	testkit.Eventually(t, "the stream failed on a message over 4 MiB", func() bool { return strings.Contains(log.String(), "ResourceExhausted") })
	if got := limitOf(t, s, "default/eg/http"); got != 3 {
		t.Errorf("over 4 MiB: the limit in force is %d, want 3 still", got)
	}
	srv.Push(t, node, "10", domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 5))
	testkit.Eventually(t, "the next snapshot in force", func() bool { return limitOf(t, s, "default/eg/http") == 5 })
}

// TestTLSRefusals wants no rules from a server that cannot show a
// certificate for the name asked, nor from one that wants a client
// certificate the client does not have: the client keeps trying, and
// says why.
func TestTLSRefusals(t *testing.T) {
	t.Parallel()
	certs := xdstest.NewCerts(t)
	srv := xdstest.Start(t, certs)
	srv.Push(t, node, "1", domain("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 3))
	for _, tc := range []struct {
		name string
		tls  xds.TLSFiles
		want string
	}{
		{"another name", xds.TLSFiles{Cert: certs.ClientCert, Key: certs.ClientKey, CA: certs.CA, ServerName: "other.test"}, "not other.test"},
		{"no client certificate", xds.TLSFiles{CA: certs.CA}, "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var log logBuffer
			s, err := service.New(memorystore.New())
			if err != nil {
				t.Fatal(err)
			}
			c, err := xds.New(xds.Config{Server: srv.Addr, NodeID: node, TLS: &tc.tls, Backoff: xds.Backoff{Initial: 20 * time.Millisecond},
				Log: slog.New(slog.NewTextHandler(&log, nil))}, s)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go c.Run(ctx)
			testkit.Eventually(t, "the refusal logged", func() bool { return strings.Contains(log.String(), tc.want) })
			select {
			case <-c.FirstResponse():
				t.Error("a response came through")
			default:
			}
			if s.Rules() != nil {
				t.Error("rules were put in force")
			}
		})
	}
	if _, err := xds.New(xds.Config{Server: srv.Addr, TLS: &xds.TLSFiles{CA: certs.ClientKey}}, nil); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("New with a key for a CA = %v, want it refused", err)
	}
}
