package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/service/config"
)

// recorder is a StatsSink that writes down what it is given, one line per
// call.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprintf(format, args...))
}

func (r *recorder) AddHits(domain, name string, fromRequest bool, hits [5]uint64) {
	r.add("hits %s %s %v %v", domain, name, fromRequest, hits)
}
func (r *recorder) DomainNotFound(domain string) { r.add("domain_not_found %s", domain) }
func (r *recorder) ConfigLoad(ok bool)           { r.add("config_load %v", ok) }
func (r *recorder) CallFailed(store bool)        { r.add("call_failed store=%v", store) }
func (r *recorder) GlobalShadowMode()            { r.add("global_shadow_mode") }

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

const sinkRules = `domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// TestStatsSink: the sink is told what envoyproxy/ratelimit's statistics
// count, under envoy's names; the names made from requests come bounded
// (metricnames.go), so none asks the sink to bound it.
func TestStatsSink(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s := newTestServer(t, sinkRules, WithStatsSink(rec, false), WithDryRun(true))
	if got, want := rec.take(), []string{"config_load true"}; !slices.Equal(got, want) {
		t.Errorf("after SetRules: %q, want %q", got, want)
	}
	for range 3 {
		ask(t, s, req("d", entries("k", "v")))
	}
	ask(t, s, req("d", entries("remote_address", "10.0.0.1")))
	ask(t, s, req("nope", entries("k", "v")))
	if _, err := s.ShouldRateLimit(context.Background(), req("")); err == nil {
		t.Error("a request without a domain is answered")
	}
	over := hitsReq("k", "v", 1)
	over.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 1}
	ask(t, s, over)
	want := []string{
		"hits d d.k false [1 0 0 1 0]",
		"hits d d.k false [1 0 1 1 0]",
		"hits d d.k false [1 1 0 0 0]",
		"global_shadow_mode",
		"hits d d.remote_address_10.0.0.1 false [1 0 0 1 0]",
		"domain_not_found nope",
		"call_failed store=false",
		"hits d d.k_v false [1 0 0 1 0]",
	}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Errorf("sink got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The server's own metrics are still there.
	if got := testutil.ToFloat64(s.stats.vecs[statTotalHits].WithLabelValues("d", "k", "")); got != 3 {
		t.Errorf("ratelimit_service_rate_limit_total_hits{key1=k} = %v, want 3", got)
	}
}

// TestStatsSinkReload: every load is counted, an unchanged one as a
// success (envoy loads it again), a refused one as an error.
func TestStatsSinkReload(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s := newTestServer(t, sinkRules, WithStatsSink(rec, false))
	path := filepath.Join(t.TempDir(), "rules.yaml")
	for _, tc := range []struct {
		rules string
		want  string
	}{
		{sinkRules, "config_load true"},
		{sinkRules, "config_load true"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: UNKNOWN, requests_per_unit: 1}}]\n", "config_load false"},
	} {
		if err := os.WriteFile(path, []byte(tc.rules), 0o644); err != nil {
			t.Fatal(err)
		}
		s.Reload(path)
		if got := rec.take(); !slices.Contains(got, tc.want) {
			t.Errorf("Reload: %q, want %q", got, tc.want)
		}
	}
}

// TestStatsSinkStoreFailed: a request a failure mode answered is counted
// once as the store's failure, as envoy's redis_error.
func TestStatsSinkStoreFailed(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s, err := New(brokenStore{}, WithStatsSink(rec, false), WithFailureMode(enforce.FailOpen), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	r, err := config.Parse("rules.yaml", []byte(sinkRules))
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(r)
	rec.take()
	ask(t, s, req("d", entries("k", "a"), entries("k", "b")))
	got := rec.take()
	if n := slices.Index(got, "call_failed store=true"); n < 0 || slices.Index(got[n+1:], "call_failed store=true") >= 0 {
		t.Errorf("sink got %q, want one call_failed store=true", got)
	}
}

// TestStatsSinkMapped: with a mapped sink, the server leaves its own
// ratelimit_service_rate_limit_* out of the registry.
func TestStatsSinkMapped(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, sinkRules, WithStatsSink(&recorder{}, true))
	ask(t, s, req("d", entries("k", "v")))
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "ratelimit_service_") {
			t.Errorf("%s is registered, with a mapped sink", mf.GetName())
		}
	}
}

// TestEnvoyStatsAddress: an IPv4 address in a statistics name is one part
// of it, its dots made '_', as envoy's SanitizeStatName makes them.
func TestEnvoyStatsAddress(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, sinkRules)
	ask(t, s, req("d", entries("remote_address", "10.0.0.1")))
	if got := testutil.ToFloat64(s.stats.vecs[statTotalHits].WithLabelValues("d", "remote_address_10_0_0_1", "")); got != 1 {
		t.Errorf("ratelimit_service_rate_limit_total_hits{key1=remote_address_10_0_0_1} = %v, want 1", got)
	}
}

// brokenStore fails every call.
type brokenStore struct{}

var errBroken = errors.New("broken")

func (brokenStore) AllowN(context.Context, string, tollgate.Limit, int) (tollgate.Result, error) {
	return tollgate.Result{}, errBroken
}

func (brokenStore) Reset(context.Context, string, tollgate.Limit) error { return errBroken }
