package service

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/health"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// Server decides rate-limit requests against its rules and store. It is
// safe for concurrent use; its rules can be swapped at any time (SetRules,
// Reload) without disturbing requests in flight.
type Server struct {
	pb.UnimplementedRateLimitServiceServer

	// What decides: the store, through the engine, under the rules in
	// force.
	store       tollgate.Store
	conc        tollgate.ConcurrencyStore // the slots of concurrency rules (WithConcurrencyStore)
	engine      *engine.Engine            // spends each descriptor's limit: the step every door shares
	snap        atomic.Pointer[snapshot]  // the rules in force, swapped whole (rules.go)
	reloadMu    sync.Mutex                // one load at a time
	reloadFails failureLog                // the log of failed loads, sampled (rules.go)
	loadOpts    []config.Option           // how Reload loads rules

	// How it decides and answers: set by the options, read-only once New
	// returns.
	failMode  enforce.FailureMode // of rules without their own
	failRetry time.Duration       // the Retry-After of a fail-closed answer
	dryRun    bool                // the global dry run: every overall answer is OK
	parallel  bool                // a request's store calls at once
	max       bounds              // on one request (limits.go)
	envoy     envoyWays           // envoyproxy/ratelimit's (envoy.go)
	hdr       headerStyle         // the rate-limit header fields (headers.go)
	timeout   time.Duration       // the engine's deadline
	logEvery  time.Duration       // the engine's failure-log interval

	// What it reports.
	log        *slog.Logger
	unmatched  unmatchedLog // descriptors that matched no rule, sampled (unmatched.go)
	now        func() time.Time
	reg        *prometheus.Registry
	m          *metrics
	stats      *envoyStats // envoyproxy/ratelimit's statistics (envoystats.go); nil when a mapped sink names them
	sink       StatsSink   // envoy's statistics, to statsd or mapped (envoysink.go)
	sinkMapped bool
	names      *metricNames // the request-dependent statistics names kept (metricnames.go)

	maxNames, maxNameBytes int // the bounds of names (WithMaxMetricNames, WithMaxMetricNameBytes)

	// Whether it should get traffic (health.go).
	health   *health.Server
	ping     func(context.Context) error
	storeUp  atomic.Bool
	draining atomic.Bool
}

// New returns a Server deciding against store. It has no rules until
// SetRules or Reload; until then /healthcheck answers 200, /readyz says
// not ready, and every request fails with gRPC Unknown, "no rate limit
// configuration loaded", as envoyproxy/ratelimit's does before its first
// config.
func New(store tollgate.Store, opts ...Option) (*Server, error) {
	s := &Server{
		store:        store,
		failMode:     enforce.FailOpen,
		failRetry:    DefaultFailClosedRetryAfter,
		max:          bounds{descriptors: DefaultMaxDescriptors, entries: DefaultMaxEntries, hits: DefaultMaxHits, bytes: DefaultMaxRequestBytes},
		envoy:        envoyWays{nearLimitRatio: DefaultNearLimitRatio},
		hdr:          headerStyle{flavor: headers.Draft},
		timeout:      enforce.DefaultTimeout,
		logEvery:     enforce.DefaultLogInterval,
		maxNames:     DefaultMaxMetricNames,
		maxNameBytes: DefaultMaxMetricNameBytes,
		now:          time.Now,
		health:       health.NewServer(),
	}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.failMode == enforce.FailDefault {
		s.failMode = enforce.FailOpen
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
		s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if err := s.checkEnvoyOptions(); err != nil {
		return nil, err
	}
	s.hdr.wire = s.wireFields()
	m, err := newMetrics(s.reg)
	if err != nil {
		return nil, err
	}
	s.m = m
	if s.names, err = newMetricNames(s.reg, s.maxNames, s.maxNameBytes); err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	if !s.sinkMapped {
		s.stats = newEnvoyStats()
		for _, c := range s.stats.collectors() {
			if err := s.reg.Register(c); err != nil {
				return nil, fmt.Errorf("server: register metrics: %w", err)
			}
		}
	}
	s.unmatched = unmatchedLog{every: s.logEvery, seed: maphash.MakeSeed()}
	s.engine = engine.NewEngine(store, s.timeout, s.log, s.logEvery, s.now)
	s.storeUp.Store(s.ping == nil)
	s.updateReady()
	return s, nil
}

// Registry returns the registry the server's metrics are on.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	resp, _, err := s.decide(ctx, apiGRPC, req, true)
	return resp, err
}
