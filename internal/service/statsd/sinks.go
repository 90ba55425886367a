package statsd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"

	"github.com/tollgate/tollgate/internal/service/series"
)

// Options are what both kinds of Stats share.
type Options struct {
	Flush time.Duration     // how often counters are flushed (DefaultFlush)
	Tags  map[string]string // envoy's EXTRA_TAGS
	Bound *series.Bound     // of the names callers' values make (series.New(0, 0))
	Log   *slog.Logger      // default slog.Default()
}

func (o *Options) log() *slog.Logger {
	if o.Log == nil {
		return slog.Default()
	}
	return o.Log
}

// NewStatsd returns Stats sent to the statsd server at addr (host:port)
// over protocol, "tcp" (envoy's, through gostats: STATSD_PROTOCOL) or
// "udp". Nothing is dialled before the first flush; while the server is
// unreachable, gostats retries every 3 seconds and drops what it cannot
// keep (4 MiB).
func NewStatsd(addr, protocol string, o Options) (*Stats, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("statsd: address %q: want host:port", addr)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("statsd: address %q: want a port number", addr)
	}
	switch protocol {
	case "tcp", "udp":
	default:
		return nil, fmt.Errorf("statsd: protocol %q: want tcp or udp", protocol)
	}
	if err := checkGostatsEnv(os.Getenv); err != nil {
		return nil, err
	}
	sink := gostats.NewNetSink(gostats.WithStatsdHost(host), gostats.WithStatsdPort(port),
		gostats.WithStatsdProtocol(protocol), gostats.WithLogger(gostatsLogger{o.log()}))
	return newStats(sink, o.Flush, o.Tags, o.Bound, nil), nil
}

// checkGostatsEnv refuses the values of the variables gostats reads from
// the environment whatever it is told (it panics on them), with a clear
// error instead.
func checkGostatsEnv(getenv func(string) string) error {
	var errs []error
	for _, name := range []string{"USE_STATSD", "GOSTATS_LOGGING_SINK_DISABLED"} {
		if v := getenv(name); v != "" {
			if _, err := strconv.ParseBool(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: want true or false", name, v))
			}
		}
	}
	for _, name := range []string{"STATSD_PORT", "GOSTATS_FLUSH_INTERVAL_SECONDS"} {
		if v := getenv(name); v != "" {
			if _, err := strconv.Atoi(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: want a whole number", name, v))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("statsd: the statsd library reads the environment: %w", errors.Join(errs...))
	}
	return nil
}

// gostatsLogger logs gostats' connection errors and drops.
type gostatsLogger struct{ log *slog.Logger }

func (l gostatsLogger) Errorf(msg string, args ...any) {
	l.log.Error("statsd: "+fmt.Sprintf(msg, args...), "component", "statsd")
}

func (l gostatsLogger) Warnf(msg string, args ...any) {
	l.log.Warn("statsd: "+fmt.Sprintf(msg, args...), "component", "statsd")
}

// MaxMappingBytes bounds a mapping file.
const MaxMappingBytes = 1 << 20

// NewMapped returns Stats mapped in process by the statsd_exporter mapping
// in file, as envoy's PROMETHEUS_MAPPER_YAML maps them: each flush goes
// through statsd_exporter's own mapper and exporter, whose series (and its
// statsd_exporter_* metrics) are registered on reg. As in envoy, the
// timer's values are milliseconds, as the statsd line carries them (a
// statsd_exporter server divides them by 1000; a mapping's scale: 0.001
// does it here). The file is a regular file of at most MaxMappingBytes.
func NewMapped(file string, reg prometheus.Registerer, o Options) (*Stats, error) {
	text, err := readMapping(file)
	if err != nil {
		return nil, err
	}
	m := &mapper.MetricMapper{Registerer: reg, Logger: o.log()}
	if err := m.InitFromYAMLString(text); err != nil {
		return nil, fmt.Errorf("statsd: mapping %s: %w", file, err)
	}
	meta, err := newExporterMetrics(reg)
	if err != nil {
		return nil, err
	}
	exp := exporter.NewExporter(reg, m, o.log(), meta.actions, meta.unmapped, meta.errors, meta.events, meta.conflicts, meta.count)
	sink := &mappedSink{events: make(chan event.Events, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		exp.Listen(sink.events)
	}()
	stop := func() {
		sink.close()
		<-done
	}
	return newStats(sink, o.Flush, o.Tags, o.Bound, stop), nil
}

func readMapping(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("statsd: mapping: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("statsd: mapping: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("statsd: mapping %s: not a regular file", file)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxMappingBytes+1))
	if err != nil {
		return "", fmt.Errorf("statsd: mapping: %w", err)
	}
	if len(b) > MaxMappingBytes {
		return "", fmt.Errorf("statsd: mapping %s: over %d bytes", file, MaxMappingBytes)
	}
	return string(b), nil
}

// mappedSink hands what gostats flushes to the exporter, as statsd
// events. Once closed it drops them: a timer of a call still ending.
type mappedSink struct {
	mu     sync.RWMutex
	closed bool
	events chan event.Events
}

func (s *mappedSink) send(e event.Event) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.closed {
		s.events <- event.Events{e}
	}
}

func (s *mappedSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.events)
	}
}

func (s *mappedSink) FlushCounter(name string, value uint64) {
	s.send(&event.CounterEvent{CMetricName: name, CValue: float64(value), CLabels: map[string]string{}})
}

func (s *mappedSink) FlushGauge(name string, value uint64) {
	s.send(&event.GaugeEvent{GMetricName: name, GValue: float64(value), GLabels: map[string]string{}})
}

func (s *mappedSink) FlushTimer(name string, value float64) {
	s.send(&event.ObserverEvent{OMetricName: name, OValue: value, OLabels: map[string]string{}})
}

// exporterMetrics are statsd_exporter's own metrics, named as its server
// names them.
type exporterMetrics struct {
	actions, errors, events, conflicts *prometheus.CounterVec
	unmapped                           prometheus.Counter
	count                              *prometheus.GaugeVec
}

func newExporterMetrics(reg prometheus.Registerer) (*exporterMetrics, error) {
	m := &exporterMetrics{
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "statsd_exporter_events_actions_total", Help: "The total number of StatsD events by action.",
		}, []string{"action"}),
		unmapped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "statsd_exporter_events_unmapped_total", Help: "The total number of StatsD events no mapping was found for.",
		}),
		count: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "statsd_exporter_metrics_total", Help: "The total number of metrics.",
		}, []string{"type"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "statsd_exporter_events_conflict_total", Help: "The total number of StatsD events with conflicting names.",
		}, []string{"type", "metric_name"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "statsd_exporter_events_total", Help: "The total number of StatsD events seen.",
		}, []string{"type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "statsd_exporter_events_error_total", Help: "The total number of StatsD events discarded due to errors.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.actions, m.unmapped, m.count, m.conflicts, m.events, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("statsd: register metrics: %w", err)
		}
	}
	return m, nil
}
