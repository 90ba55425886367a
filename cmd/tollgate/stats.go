package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/series"
	"github.com/tollgate/tollgate/internal/service/statsd"
)

// statsFlags are serve's flags for envoyproxy/ratelimit's statistics,
// named as envoy names them: sent to a statsd server (envoy's USE_STATSD)
// or a DogStatsD agent (USE_DOG_STATSD), or mapped in process by a
// statsd_exporter mapping onto the Prometheus metrics (envoy's
// PROMETHEUS_MAPPER_YAML). There is one of them at most.
type statsFlags struct {
	statsd, protocol string
	dogstatsd        string
	mogrifiers       string
	flush            time.Duration
	tags             string
	mapper           string

	dog statsd.DogOptions // read by readEnv
	st  *statsd.Stats     // made by options
}

func (x *statsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&x.statsd, "statsd", "", "send envoyproxy/ratelimit's statistics, named as it names them, to the statsd server at this host:port (envoy's USE_STATSD, STATSD_HOST, STATSD_PORT)")
	fs.StringVar(&x.protocol, "statsd-protocol", "tcp", "how --statsd sends: tcp or udp")
	fs.StringVar(&x.dogstatsd, "dogstatsd", "", "send envoyproxy/ratelimit's statistics in DogStatsD's format, over UDP, to the agent at this host:port, tagged with $DD_ENV, $DD_SERVICE, $DD_VERSION and $DD_ENTITY_ID as Datadog's client tags them (envoy's USE_DOG_STATSD, STATSD_HOST, STATSD_PORT)")
	fs.StringVar(&x.mogrifiers, "dogstatsd-mogrifiers", "", "with --dogstatsd: the mogrifiers that rename and tag the statistics, NAME,NAME, each read from $DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS; the first whose pattern matches a name applies (envoy's USE_DOG_STATSD_MOGRIFIERS)")
	fs.DurationVar(&x.flush, "stats-flush", statsd.DefaultFlush, "how often --statsd, --dogstatsd or --prometheus-mapper flushes the counters, as what they grew by (envoy's STATS_FLUSH_INTERVAL)")
	fs.StringVar(&x.tags, "stats-tags", "", "tags of --statsd's, --dogstatsd's and --prometheus-mapper's statistics, as envoy's EXTRA_TAGS: name:value,name:value")
	fs.StringVar(&x.mapper, "prometheus-mapper", "", "map envoyproxy/ratelimit's statistics onto the Prometheus metrics with this statsd_exporter mapping file, in process (envoy's PROMETHEUS_MAPPER_YAML); its series replace tollgate's own ratelimit_service_rate_limit_*")
}

func (x *statsFlags) check() error {
	if n := countTrue(x.statsd != "", x.dogstatsd != "", x.mapper != ""); n > 1 {
		return fmt.Errorf("--statsd, --dogstatsd and --prometheus-mapper: one at most (envoyproxy/ratelimit has one statistics sink)")
	}
	if x.mogrifiers != "" && x.dogstatsd == "" {
		return fmt.Errorf("--dogstatsd-mogrifiers is for --dogstatsd")
	}
	if x.flush <= 0 {
		return fmt.Errorf("--stats-flush %v: want a positive duration", x.flush)
	}
	if _, err := parseTags(x.tags); err != nil {
		return err
	}
	return nil
}

// readEnv reads what --dogstatsd takes from the environment: the
// mogrifiers --dogstatsd-mogrifiers names, refused here, before anything
// starts, when their variables are wrong; and Datadog's own tags.
func (x *statsFlags) readEnv(getenv env) error {
	if x.dogstatsd == "" {
		return nil
	}
	ms, err := statsd.MogrifiersFromEnv(statsd.MogrifierNames(x.mogrifiers), getenv)
	if err != nil {
		return fmt.Errorf("--dogstatsd-mogrifiers %q: %w", x.mogrifiers, err)
	}
	x.dog = statsd.DogOptions{Mogrifiers: ms, Tags: statsd.DatadogEnvTags(getenv)}
	return nil
}

// mogrifierLabels are the mogrifiers' names, in order, for the log.
func mogrifierLabels(ms []statsd.Mogrifier) string {
	labels := make([]string, len(ms))
	for i, m := range ms {
		labels[i] = m.Label
	}
	return strings.Join(labels, ",")
}

// countTrue is how many of bs are true.
func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// parseTags reads envoy's EXTRA_TAGS: name:value pairs, comma-separated.
func parseTags(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	tags := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(pair, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("--stats-tags %q: want name:value,name:value", s)
		}
		tags[k] = v
	}
	return tags, nil
}

// options makes the statistics the flags ask for, and returns the server
// options that send them there (none when there are none).
func (x *statsFlags) options(log *slog.Logger) ([]service.Option, error) {
	if x.statsd == "" && x.dogstatsd == "" && x.mapper == "" {
		return nil, nil
	}
	tags, err := parseTags(x.tags)
	if err != nil {
		return nil, err
	}
	// The registry New would make, made here for the count of folded
	// names and for the mapping's series.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	bound := series.New(0, 0)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "tollgate_serve_stat_names_folded_total",
		Help: "Statistics that a request would have named after its values (detailed_metric, value_to_metric, a descriptor's own limit, an unknown domain), counted under __overflow__ instead: past the bound of such names.",
	}, func() float64 { return float64(bound.Folded()) }))
	o := statsd.Options{Flush: x.flush, Tags: tags, Bound: bound, Log: log}
	mapped := x.mapper != ""
	switch {
	case mapped:
		x.st, err = statsd.NewMapped(x.mapper, reg, o)
	case x.dogstatsd != "":
		x.st, err = statsd.NewDogStatsd(x.dogstatsd, x.dog, o)
	default:
		x.st, err = statsd.NewStatsd(x.statsd, x.protocol, o)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case mapped:
		log.Info("statistics mapped in process", "mapping", x.mapper, "flush", x.flush)
	case x.dogstatsd != "":
		log.Info("statistics to dogstatsd", "addr", x.dogstatsd, "protocol", "udp", "mogrifiers", mogrifierLabels(x.dog.Mogrifiers), "tags", strings.Join(x.dog.Tags, ","), "flush", x.flush)
	default:
		log.Info("statistics to statsd", "addr", x.statsd, "protocol", x.protocol, "flush", x.flush)
	}
	return []service.Option{service.WithRegistry(reg), service.WithStatsSink(x.st, mapped)}, nil
}

// watchRedis counts client's connections in envoy's statistics of its
// Redis pool (statsd.Stats.RedisPool), when there are statistics: those
// opened by a dial hook of go-redis's (on each node's client of a
// Cluster), those open from its pool statistics. Call it before the
// client's first command, so that the hook sees every connection.
func (x *statsFlags) watchRedis(client redis.UniversalClient) {
	if x.st == nil {
		return
	}
	d := &dialCount{}
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(d) })
	} else {
		client.AddHook(d)
	}
	x.st.RedisPool(d.n.Load, func() uint64 { return openConns(client.PoolStats()) })
}

// openConns is how many connections a client's pools hold: its commands',
// its pipelines' and its Pub/Sub's.
func openConns(s *redis.PoolStats) uint64 {
	n := uint64(s.TotalConns) + uint64(s.PubSubStats.Active)
	if s.PipelineStats != nil {
		n += uint64(s.PipelineStats.TotalConns)
	}
	return n
}

// dialCount is a go-redis hook that counts the connections opened.
type dialCount struct{ n atomic.Uint64 }

func (d *dialCount) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			d.n.Add(1)
		}
		return c, err
	}
}

func (d *dialCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// run flushes the statistics until ctx ends.
func (x *statsFlags) run(ctx context.Context) {
	if x.st != nil {
		go x.st.Run(ctx)
	}
}

// close waits for the last flush and ends the statistics.
func (x *statsFlags) close() {
	if x.st != nil {
		x.st.Close()
	}
}

// grpcOptions count and time every gRPC call, as envoy's
// ratelimit_server.<method>.total_requests and .response_time.
func (x *statsFlags) grpcOptions() []grpc.ServerOption {
	if x.st == nil {
		return nil
	}
	st := x.st
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		done := st.Call(info.FullMethod)
		defer done()
		return h(ctx, req)
	})}
}
