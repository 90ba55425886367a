package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"google.golang.org/grpc"

	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service"
)

// tracingFlags are serve's OpenTelemetry flags (docs/operations.md,
// Tracing). They mirror envoyproxy/ratelimit's TRACING_* settings; what
// they leave out (headers, certificates, timeouts, batch sizes) the
// OpenTelemetry SDK reads from its standard OTEL_* environment variables.
type tracingFlags struct {
	on                             bool
	service, namespace, instanceID string
	rate                           float64
	protocol, endpoint             string
}

func (t *tracingFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&t.on, "tracing", false, "export an OpenTelemetry span of every decision request (gRPC ShouldRateLimit, /json, /auth) over OTLP; off, tracing costs nothing")
	fs.StringVar(&t.service, "tracing-service-name", "tollgate", "service.name of the spans")
	fs.StringVar(&t.namespace, "tracing-service-namespace", "", "service.namespace of the spans")
	fs.StringVar(&t.instanceID, "tracing-service-instance-id", "", "service.instance.id of the spans (default: the one $OTEL_RESOURCE_ATTRIBUTES names, else a random UUID, new at each start)")
	fs.Float64Var(&t.rate, "tracing-sampling-rate", 1, "fraction of new traces to sample, 0 to 1; a request whose traceparent says whether its trace is sampled follows it")
	fs.StringVar(&t.protocol, "tracing-exporter-protocol", "http", "OTLP protocol: http (protobuf over HTTP, port 4318) or grpc (port 4317)")
	fs.StringVar(&t.endpoint, "tracing-endpoint", "", "OTLP collector URL, http:// or https://, such as http://otel-collector:4318; over http a URL without a path gets /v1/traces (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT, else localhost)")
}

// check validates the flags, whether tracing is on or not, so that a
// mistake shows when it is made rather than when tracing is turned on.
func (t *tracingFlags) check() error {
	if math.IsNaN(t.rate) || t.rate < 0 || t.rate > 1 {
		return fmt.Errorf("--tracing-sampling-rate %v: want a fraction from 0 to 1", t.rate)
	}
	if t.protocol != "http" && t.protocol != "grpc" {
		return fmt.Errorf("--tracing-exporter-protocol %q: want http or grpc", t.protocol)
	}
	if t.endpoint != "" {
		u, err := url.Parse(t.endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--tracing-endpoint %q: want an http:// or https:// URL with a host, such as http://otel-collector:4318", t.endpoint)
		}
	}
	return nil
}

// sampler samples a fraction rate of new traces, and follows the caller's
// decision (the traceparent's sampled flag) for the rest: a gateway that
// samples a request gets the decision's span in its trace, whatever the
// rate.
func (t *tracingFlags) sampler() sdktrace.Sampler {
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.rate))
}

// tracing is serve's tracer provider, or nothing when tracing is off.
type tracing struct {
	tp *sdktrace.TracerProvider // nil when off
}

// start makes the tracer provider when --tracing is on: an OTLP exporter
// behind a batch span processor, which sends spans in the background and
// drops them, rather than slow decisions down, when the collector cannot
// keep up. When tracing is off it sets up nothing and returns a tracing
// that changes nothing. No global provider is set either way: spans come
// from the server's tracing wrappers only.
func (t *tracingFlags) start(log *slog.Logger) (*tracing, error) {
	if !t.on {
		return &tracing{}, nil
	}
	exp, err := t.exporter()
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := t.resource()
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	// Export errors (a collector away) reach the SDK's global error
	// handler; they go to the service's log, at most one line a minute.
	failures := &engine.Sampler{Every: time.Minute}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		if ok, skipped := failures.Allow(time.Now()); ok {
			log.Warn("tracing: spans not exported", "error", err.Error(), engine.Skipped(skipped))
		}
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(t.sampler()), sdktrace.WithResource(res))
	id, _ := res.Set().Value(semconv.ServiceInstanceIDKey)
	log.Info("tracing on", "protocol", t.protocol, "endpoint", t.endpointForLog(), "sampling_rate", t.rate,
		"service_name", t.service, "service_namespace", t.namespace, "service_instance_id", id.String())
	return &tracing{tp: tp}, nil
}

// exporter makes the OTLP exporter of the protocol. It connects lazily:
// a collector that is not there yet costs nothing at startup.
func (t *tracingFlags) exporter() (sdktrace.SpanExporter, error) {
	ctx := context.Background()
	if t.protocol == "grpc" {
		var opts []otlptracegrpc.Option
		if t.endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(t.endpoint))
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	var opts []otlptracehttp.Option
	if t.endpoint != "" {
		u, _ := url.Parse(t.endpoint) // checked by check
		if u.Path == "" || u.Path == "/" {
			// As $OTEL_EXPORTER_OTLP_ENDPOINT: a collector's base URL.
			u.Path = "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	}
	return otlptracehttp.New(ctx, opts...)
}

// endpointForLog is where spans go, for the log line: the flag, or where
// the SDK's environment points.
func (t *tracingFlags) endpointForLog() string {
	if t.endpoint != "" {
		u, _ := url.Parse(t.endpoint)
		return u.Redacted()
	}
	return "from OTEL_EXPORTER_OTLP_* or the default"
}

// resource describes the process on every span: the SDK's defaults
// (including $OTEL_RESOURCE_ATTRIBUTES) and the flags, which win. The
// random instance id is made only when neither names one.
func (t *tracingFlags) resource() (*resource.Resource, error) {
	base := resource.Default()
	kvs := []attribute.KeyValue{semconv.ServiceName(t.service)}
	id := t.instanceID
	if _, named := base.Set().Value(semconv.ServiceInstanceIDKey); id == "" && !named {
		id = randomUUID()
	}
	if id != "" {
		kvs = append(kvs, semconv.ServiceInstanceID(id))
	}
	if t.namespace != "" {
		kvs = append(kvs, semconv.ServiceNamespace(t.namespace))
	}
	return resource.Merge(base, resource.NewWithAttributes(semconv.SchemaURL, kvs...))
}

// randomUUID is a random (version 4) UUID, as envoyproxy/ratelimit names
// an instance it was given no id for.
func randomUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// grpcOptions are the gRPC server options that trace ShouldRateLimit, or
// none when tracing is off.
func (tr *tracing) grpcOptions() []grpc.ServerOption {
	if tr.tp == nil {
		return nil
	}
	return []grpc.ServerOption{service.TraceGRPC(tr.tp)}
}

// handler is h with /json and /auth traced, or h itself when tracing is
// off.
func (tr *tracing) handler(h http.Handler) http.Handler {
	if tr.tp == nil {
		return h
	}
	return service.TraceHTTP(tr.tp, h)
}

// shutdown sends the spans still queued, waiting up to timeout, and stops
// the exporter. Serve calls it after the listeners have drained, so the
// spans of the last requests are sent too.
func (tr *tracing) shutdown(timeout time.Duration, log *slog.Logger) {
	if tr.tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := tr.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: spans still queued at shutdown were not all sent", "error", err.Error())
	}
}
