package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP trace receiver on loopback, over HTTP or gRPC, that
// keeps every export request it gets.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	url string // what --tracing-endpoint is given

	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// ServeHTTP is OTLP/HTTP with protobuf bodies at /v1/traces, the path the
// exporter adds to a collector's base URL.
func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf POST to /v1/traces", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := new(coltracepb.ExportTraceServiceRequest)
	if err := proto.Unmarshal(body, req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, _ := c.Export(r.Context(), req)
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func startCollector(t *testing.T, protocol string) *collector {
	t.Helper()
	c := new(collector)
	if protocol == "http" {
		ts := httptest.NewServer(c)
		t.Cleanup(ts.Close)
		c.url = ts.URL
		return c
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(g, c)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	c.url = "http://" + lis.Addr().String()
	return c
}

// exports returns what the collector received so far.
func (c *collector) exports() []*coltracepb.ExportTraceServiceRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*coltracepb.ExportTraceServiceRequest(nil), c.reqs...)
}

// receivedSpan is one span as the collector got it, with its resource.
type receivedSpan struct {
	name              string
	traceID, parentID string
	attrs, resource   map[string]string
	kindServer        bool
}

func flatten(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		default:
			m[kv.GetKey()] = fmt.Sprint(v)
		}
	}
	return m
}

func spansOf(reqs []*coltracepb.ExportTraceServiceRequest) []receivedSpan {
	var out []receivedSpan
	for _, req := range reqs {
		for _, rs := range req.GetResourceSpans() {
			res := flatten(rs.GetResource().GetAttributes())
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					out = append(out, receivedSpan{
						name: s.GetName(), traceID: hex.EncodeToString(s.GetTraceId()), parentID: hex.EncodeToString(s.GetParentSpanId()),
						attrs: flatten(s.GetAttributes()), resource: res, kindServer: s.GetKind().String() == "SPAN_KIND_SERVER",
					})
				}
			}
		}
	}
	return out
}

// TestServeExportsSpans runs the tollgate binary with --tracing pointed at
// a collector the test serves on loopback, over each OTLP protocol; sends
// it a gRPC and a /json request, each with a traceparent as Envoy sends it;
// and stops it. The batch processor is told to wait ten minutes between
// exports, so the spans reach the collector only because shutdown flushes
// them. They must continue the callers' trace and carry the flags'
// resource, and the export must hold no descriptor value.
func TestServeExportsSpans(t *testing.T) {
	t.Parallel()
	const (
		parentTrace = "0af7651916cd43dd8448eb211c80319c"
		parentSpan  = "b7ad6b7169203331"
		traceparent = "00-" + parentTrace + "-" + parentSpan + "-01"
	)
	rules := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(rules, []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	secrets := []string{"198.51.100.41", "sk-live-9d2e71"}

	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			c := startCollector(t, protocol)
			p := startTollgateWith(t, launch{env: []string{"OTEL_BSP_SCHEDULE_DELAY=600000"}}, "serve",
				"--config", rules, "--tracing", "--tracing-exporter-protocol", protocol, "--tracing-endpoint", c.url,
				"--tracing-service-name", "tollgate-test", "--tracing-service-namespace", "edge-ns", "--tracing-service-instance-id", "instance-7")
			p.log.waitFor(t, regexp.MustCompile(`msg="tracing on" protocol=`+protocol), 5*time.Second)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := p.rls.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent),
				request("edge", desc("remote_address", secrets[0]), desc("api_key", secrets[1])))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := resp.OverallCode, pb.RateLimitResponse_OK; got != want {
				t.Errorf("gRPC: %v, want %v", got, want)
			}
			body := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"` + secrets[0] + `"}]}]}`
			req, err := http.NewRequestWithContext(ctx, "POST", p.http+"/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("traceparent", traceparent)
			hresp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			hresp.Body.Close()
			if got, want := hresp.StatusCode, http.StatusTooManyRequests; got != want {
				t.Errorf("/json: %d, want %d", got, want)
			}
			if n := len(c.exports()); n != 0 {
				t.Errorf("%d exports before shutdown, want 0: the batch waits ten minutes", n)
			}

			p.stop()
			if p.exitErr != nil {
				t.Errorf("tollgate exited with %v", p.exitErr)
			}
			exports := c.exports()
			spans := spansOf(exports)
			byName := map[string]receivedSpan{}
			for _, s := range spans {
				byName[s.name] = s
			}
			if len(spans) != 2 {
				t.Fatalf("%d spans exported at shutdown, want 2: %v", len(spans), spans)
			}
			tests := []struct {
				name  string
				attrs map[string]string
			}{
				{"envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", map[string]string{
					"ratelimit.domain": "edge", "ratelimit.overall_code": "OK", "rpc.response.status_code": "OK"}},
				{"POST /json", map[string]string{"http.route": "/json", "http.response.status_code": "429"}},
			}
			for _, tc := range tests {
				s, ok := byName[tc.name]
				if !ok {
					t.Errorf("no span %q among %v", tc.name, spans)
					continue
				}
				if got, want := s.traceID, parentTrace; got != want {
					t.Errorf("%s: trace %s, want the caller's %s", tc.name, got, want)
				}
				if got, want := s.parentID, parentSpan; got != want {
					t.Errorf("%s: parent %s, want the caller's span %s", tc.name, got, want)
				}
				if !s.kindServer {
					t.Errorf("%s: not a server span", tc.name)
				}
				checkMap(t, tc.name+" attribute", s.attrs, tc.attrs)
				checkMap(t, tc.name+" resource", s.resource, map[string]string{
					"service.name": "tollgate-test", "service.namespace": "edge-ns", "service.instance.id": "instance-7"})
			}
			for _, e := range exports {
				text := protojson.Format(e)
				for _, secret := range secrets {
					if strings.Contains(text, secret) {
						t.Errorf("the export carries the descriptor value %q", secret)
					}
				}
			}
		})
	}
}

func checkMap(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s %s = %q (present %v), want %q", what, k, g, ok, w)
		}
	}
}

// TestTracingFlagsChecked: a wrong tracing flag stops serve at once with
// exit code 2, whether tracing is on or not.
func TestTracingFlagsChecked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--tracing-sampling-rate", "1.5"}, "--tracing-sampling-rate 1.5: want a fraction from 0 to 1"},
		{[]string{"--tracing", "--tracing-sampling-rate", "-0.1"}, "--tracing-sampling-rate -0.1"},
		{[]string{"--tracing-sampling-rate", "NaN"}, "--tracing-sampling-rate NaN"},
		{[]string{"--tracing", "--tracing-exporter-protocol", "thrift"}, `--tracing-exporter-protocol "thrift": want http or grpc`},
		{[]string{"--tracing", "--tracing-endpoint", "otel-collector:4317"}, `--tracing-endpoint "otel-collector:4317": want an http:// or https:// URL`},
		{[]string{"--tracing-endpoint", "ftp://otel-collector"}, `--tracing-endpoint "ftp://otel-collector"`},
		{[]string{"--tracing-endpoint", "http://"}, `--tracing-endpoint "http://"`},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		args := append([]string{"tollgate", "serve", "--config", "../../internal/service/config/testdata/envoy"}, tc.args...)
		code := run(context.Background(), args, func(string) string { return "" }, &out, &errb)
		if got, want := code, 2; got != want {
			t.Errorf("%v: exit code %d, want %d", tc.args, got, want)
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: stderr %q, want it to say %q", tc.args, errb.String(), tc.want)
		}
	}
}

// TestTracingSampler: the sampling rate decides for new traces only; a
// caller's traceparent decides for its own.
func TestTracingSampler(t *testing.T) {
	t.Parallel()
	parent := func(sampled bool) context.Context {
		cfg := trace.SpanContextConfig{TraceID: trace.TraceID{0xab, 1}, SpanID: trace.SpanID{1}, Remote: true}
		if sampled {
			cfg.TraceFlags = trace.FlagsSampled
		}
		return trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(cfg))
	}
	tests := []struct {
		name string
		rate float64
		ctx  context.Context
		want sdktrace.SamplingDecision
	}{
		{"rate 0, new trace", 0, context.Background(), sdktrace.Drop},
		{"rate 0, the caller samples", 0, parent(true), sdktrace.RecordAndSample},
		{"rate 1, new trace", 1, context.Background(), sdktrace.RecordAndSample},
		{"rate 1, the caller does not sample", 1, parent(false), sdktrace.Drop},
	}
	for _, tc := range tests {
		f := tracingFlags{rate: tc.rate}
		res := f.sampler().ShouldSample(sdktrace.SamplingParameters{ParentContext: tc.ctx, TraceID: trace.TraceID{0xff, 0xff}, Name: "x"})
		if got := res.Decision; got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestTracingOff: without --tracing, serve's handler and gRPC options are
// unchanged and no global tracer provider is set.
func TestTracingOff(t *testing.T) {
	t.Parallel()
	f := tracingFlags{rate: 1, protocol: "http"}
	tr, err := f.start(nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	if got := tr.handler(mux); got != http.Handler(mux) {
		t.Errorf("handler wrapped with tracing off")
	}
	if got := len(tr.grpcOptions()); got != 0 {
		t.Errorf("%d gRPC options with tracing off, want none", got)
	}
	if _, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider); sdk {
		t.Errorf("a global SDK tracer provider is set")
	}
	tr.shutdown(time.Second, nil) // nothing to flush, and no logger needed
}

// TestServeTracingInstanceID: the instance id is the flag's, else the one
// $OTEL_RESOURCE_ATTRIBUTES names, else a random UUID.
func TestServeTracingInstanceID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		args []string
		want string // a regular expression
	}{
		{"flag", []string{"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=pod-42"}, []string{"--tracing-service-instance-id", "instance-7"}, `instance-7`},
		{"environment", []string{"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=pod-42"}, nil, `pod-42`},
		{"neither: random", nil, nil, `[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Nothing is traced here: the endpoint only has to be valid.
			args := append([]string{"--config", "../../internal/service/config/testdata/envoy", "--tracing", "--tracing-endpoint", "http://127.0.0.1:9"}, tc.args...)
			p := startTollgateWith(t, launch{env: tc.env}, "serve", args...)
			p.log.waitFor(t, regexp.MustCompile(`msg="tracing on" .* service_instance_id=`+tc.want+`\n`), 5*time.Second)
		})
	}
}

// TestServeLogsExportFailures: a collector that refuses the spans makes
// serve log it, and serve goes on answering.
func TestServeLogsExportFailures(t *testing.T) {
	t.Parallel()
	refuser := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusBadRequest) // not retried by the exporter
	}))
	t.Cleanup(refuser.Close)
	p := startTollgateWith(t, launch{env: []string{"OTEL_BSP_SCHEDULE_DELAY=50"}}, "serve",
		"--config", "../../internal/service/config/testdata/envoy", "--tracing", "--tracing-endpoint", refuser.URL)
	if got, want := p.ask(request("edge", desc("tenant", "t-"+randomID()))).OverallCode, pb.RateLimitResponse_OK; got != want {
		t.Errorf("%v, want %v", got, want)
	}
	p.log.waitFor(t, regexp.MustCompile(`level=WARN msg="tracing: spans not exported" error=.*400`), 10*time.Second)
}
