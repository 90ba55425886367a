// Package statsd sends envoyproxy/ratelimit's statistics, named as it
// names them, through lyft/gostats, the statistics library envoy's service
// itself uses: to a statsd server (envoy's USE_STATSD), to a DogStatsD
// agent in its format, renamed and tagged by mogrifiers (envoy's
// USE_DOG_STATSD: see NewDogStatsd), or through a statsd_exporter mapping
// applied in process, whose series are on the service's Prometheus
// registry (envoy's PROMETHEUS_MAPPER_YAML).
//
// The names are envoy's:
//
//	ratelimit.service.rate_limit.<rule>.{total_hits,over_limit,near_limit,within_limit,shadow_mode}
//	ratelimit.service.rate_limit.<domain>.domain_not_found
//	ratelimit.service.config_load_success, ratelimit.service.config_load_error
//	ratelimit.service.call.should_rate_limit.{service_error,redis_error}
//	ratelimit.service.global_shadow_mode
//	ratelimit_server.<method>.total_requests, ratelimit_server.<method>.response_time (a timer, in ms)
//	ratelimit.go.* (the Go runtime's gauges and counters)
//	ratelimit.redis_pool.{cx_active,cx_total,cx_local_close} (RedisPool)
//
// where <rule> is a rule's statistics name (domain.key_value.key…). As in
// envoy, counters are kept in the process and flushed every flush
// interval, as what they grew by since the last flush, and only when they
// did; the timer is sent as each call ends. EXTRA_TAGS are gostats tags of
// the ratelimit and ratelimit_server scopes (name.__tag=value).
//
// Names made from callers' values (descriptor values of detailed_metric
// and value_to_metric rules, a descriptor's own limit, an unknown domain)
// are bounded by a series.Bound: past it they are counted under
// series.Overflow, and the bound counts them as folded.
package statsd

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"time"

	gostats "github.com/lyft/gostats"

	"github.com/tollgate/tollgate/internal/service/series"
)

// DefaultFlush is envoy's STATS_FLUSH_INTERVAL.
const DefaultFlush = 10 * time.Second

// Rule statistics, in the order of the hits AddHits takes.
var ruleStatNames = [5]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

// Stats are envoy's statistics of one service, kept in a gostats store
// until flushed to its sink. It is safe for concurrent use.
type Stats struct {
	store gostats.Store
	flush time.Duration
	bound *series.Bound
	stop  func() // ends the sink's own goroutine, after the last flush

	rateLimit gostats.Scope // ratelimit.service.rate_limit
	server    gostats.Scope // ratelimit_server
	rules     sync.Map      // statistics name → *[5]gostats.Counter

	configOK, configErr  gostats.Counter
	serviceErr, redisErr gostats.Counter
	globalShadow         gostats.Counter
	methods              sync.Map // gRPC method → *method
	runOnce, closeOnce   sync.Once
	done                 chan struct{}
	root                 gostats.Scope // ratelimit
}

type method struct {
	total gostats.Counter
	time  gostats.Timer
}

// newStats makes the statistics of a store flushing to sink, with tags on
// envoy's two root scopes, as envoy's service makes them.
func newStats(sink gostats.Sink, flush time.Duration, tags map[string]string, bound *series.Bound, stop func()) *Stats {
	if flush <= 0 {
		flush = DefaultFlush
	}
	if bound == nil {
		bound = series.New(0, 0)
	}
	store := gostats.NewStore(sink, false)
	root := store.ScopeWithTags("ratelimit", tags)
	service := root.Scope("service")
	call := service.Scope("call.should_rate_limit")
	store.AddStatGenerator(gostats.NewRuntimeStats(root.Scope("go")))
	return &Stats{
		store: store, flush: flush, bound: bound, stop: stop,
		rateLimit:    service.Scope("rate_limit"),
		server:       store.ScopeWithTags("ratelimit_server", tags),
		configOK:     service.NewCounter("config_load_success"),
		configErr:    service.NewCounter("config_load_error"),
		serviceErr:   call.NewCounter("service_error"),
		redisErr:     call.NewCounter("redis_error"),
		globalShadow: service.NewCounter("global_shadow_mode"),
		done:         make(chan struct{}),
		root:         root,
	}
}

// RedisPool adds envoy's statistics of its Redis connection pool, made at
// each flush from what the client reports: opened, how many connections
// it has opened so far, and open, how many are open now. They are sent as
// envoy's are: ratelimit.redis_pool.cx_active, the connections open (a
// gauge); cx_total, those opened; cx_local_close, those closed, which is
// the difference. A connection being opened at the instant of a flush may
// count as closed there until a real close takes its place: the counters
// never go down. Call it once, before Run.
func (s *Stats) RedisPool(opened, open func() uint64) {
	scope := s.root.Scope("redis_pool")
	s.store.AddStatGenerator(&poolStats{opened: opened, open: open,
		active: scope.NewGauge("cx_active"), total: scope.NewCounter("cx_total"), closed: scope.NewCounter("cx_local_close")})
}

// poolStats makes the Redis pool's statistics at each flush.
type poolStats struct {
	opened, open          func() uint64
	active                gostats.Gauge
	total, closed         gostats.Counter
	lastTotal, lastClosed uint64 // what the counters were given so far
}

func (p *poolStats) GenerateStats() {
	active := p.open()
	total := max(p.opened(), p.lastTotal) // read after open: no open connection uncounted
	active = min(active, total)
	closed := max(total-active, p.lastClosed)
	p.active.Set(active)
	p.total.Add(total - p.lastTotal)
	p.closed.Add(closed - p.lastClosed)
	p.lastTotal, p.lastClosed = total, closed
}

// Bound is the bound of the names made from callers' values.
func (s *Stats) Bound() *series.Bound { return s.bound }

// Run flushes the statistics every flush interval until ctx ends, then
// once more, waiting for that last flush at most a second, and returns.
// Call it once.
func (s *Stats) Run(ctx context.Context) {
	s.runOnce.Do(func() {
		defer close(s.done)
		t := time.NewTicker(s.flush)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.store.Flush()
			case <-ctx.Done():
				last := make(chan struct{})
				go func() { s.store.Flush(); close(last) }()
				select {
				case <-last:
				case <-time.After(time.Second):
				}
				return
			}
		}
	})
}

// Close waits for Run to return (when it was started) and ends the sink.
func (s *Stats) Close() {
	s.closeOnce.Do(func() {
		started := true
		s.runOnce.Do(func() { started = false })
		if started {
			<-s.done
		}
		if s.stop != nil {
			s.stop()
		}
	})
}

// Flush sends what changed now, without waiting for the interval.
func (s *Stats) Flush() { s.store.Flush() }

// AddHits adds a decided descriptor's hits to the statistics of its rule's
// statistics name, in the order total_hits, over_limit, near_limit,
// within_limit, shadow_mode. fromRequest says that the name holds the
// request's values (detailed_metric, value_to_metric, a descriptor's own
// limit): such names are bounded, and past the bound the hits are counted
// under the domain's series.Overflow name.
func (s *Stats) AddHits(domain, name string, fromRequest bool, hits [5]uint64) {
	name = sanitize(name)
	if fromRequest && !s.bound.Admit(name) {
		name = sanitize(domain) + "." + series.Overflow
	}
	cs := s.rule(name)
	for i, n := range hits {
		if n > 0 {
			cs[i].Add(n)
		}
	}
}

// rule returns the counters of a rule's statistics name, made on first use.
func (s *Stats) rule(name string) *[5]gostats.Counter {
	if cs, ok := s.rules.Load(name); ok {
		return cs.(*[5]gostats.Counter)
	}
	var cs [5]gostats.Counter
	for i, stat := range ruleStatNames {
		cs[i] = s.rateLimit.NewCounter(name + "." + stat)
	}
	got, _ := s.rules.LoadOrStore(strings.Clone(name), &cs)
	return got.(*[5]gostats.Counter)
}

// DomainNotFound counts a descriptor of a domain no rule has.
func (s *Stats) DomainNotFound(domain string) {
	name := sanitize(domain)
	if !s.bound.Admit(name) {
		name = series.Overflow
	}
	s.rateLimit.NewCounter(name + ".domain_not_found").Inc()
}

// ConfigLoad counts a load of the rules: a success, or an error (the
// previous rules stay).
func (s *Stats) ConfigLoad(ok bool) {
	if ok {
		s.configOK.Inc()
	} else {
		s.configErr.Inc()
	}
}

// CallFailed counts a ShouldRateLimit call that failed: by the store
// (redis_error), or refused by the service (service_error).
func (s *Stats) CallFailed(store bool) {
	if store {
		s.redisErr.Inc()
	} else {
		s.serviceErr.Inc()
	}
}

// GlobalShadowMode counts a request over the limit answered OK because of
// the global shadow mode.
func (s *Stats) GlobalShadowMode() { s.globalShadow.Inc() }

// Call counts a call of a gRPC method (its full name,
// /package.Service/Method) and returns the function that times it, to be
// called when it ends: ratelimit_server.<Method>.total_requests and
// .response_time, in whole milliseconds as envoy sends them.
func (s *Stats) Call(fullMethod string) func() {
	m := s.method(fullMethod)
	m.total.Inc()
	start := time.Now()
	return func() { m.time.AddValue(float64(time.Since(start).Milliseconds())) }
}

func (s *Stats) method(fullMethod string) *method {
	if m, ok := s.methods.Load(fullMethod); ok {
		return m.(*method)
	}
	name := "unknown"
	if _, after, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/"); ok {
		name = sanitize(after)
	}
	m, _ := s.methods.LoadOrStore(fullMethod, &method{
		total: s.server.NewCounter(name + ".total_requests"),
		time:  s.server.NewTimer(name + ".response_time"),
	})
	return m.(*method)
}

var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// sanitize makes a statistics name safe in a statsd line: it replaces ':'
// and '|' by '_' and the dots of an IPv4 address by '_', as envoy does, and
// also the bytes envoy lets through that a statsd server would read as
// the end of the line or as tags (control bytes, ',', '#', '[', ']'), so
// that no descriptor value can add lines or labels.
func sanitize(s string) string {
	if strings.IndexFunc(s, unsafeRune) >= 0 {
		s = strings.Map(func(r rune) rune {
			if unsafeRune(r) {
				return '_'
			}
			return r
		}, s)
	}
	if strings.Count(s, ".") >= 3 && ipv4.MatchString(s) {
		s = ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
	}
	return s
}

func unsafeRune(r rune) bool {
	switch r {
	case ':', '|', ',', '#', '[', ']', 0x7f:
		return true
	}
	return r < 0x20
}
