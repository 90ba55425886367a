package service

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/internal/door/engine"
)

// The trace and parent span every traced test request claims to come from,
// as a gateway's traceparent header carries them.
const (
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
)

func traceparent(flags string) string { return "00-" + parentTrace + "-" + parentSpan + "-" + flags }

// secrets are the descriptor values of the test requests: API keys,
// client addresses and paths, none of which a span may carry.
var secrets = []string{"198.51.100.23", "198.51.100.24", "198.51.100.25", "sk-live-4f1c9a", "sk-live-77e0b2", "alice-private-path"}

const tracedRules = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// newRecorder returns a tracer provider that records every span it is
// asked to sample, as the service's sampler does at rate 1: a caller's
// unsampled traceparent is followed.
func newRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, exp
}

// spansAfter waits until exp holds n spans (a span ends just before the
// answer leaves, so it is normally there at once) and returns them; when
// n is 0 it gives late spans a moment to show.
func spansAfter(t *testing.T, exp *tracetest.InMemoryExporter, n int) tracetest.SpanStubs {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	if n == 0 {
		deadline = time.Now().Add(100 * time.Millisecond)
	}
	for {
		got := exp.GetSpans()
		if (n > 0 && len(got) >= n) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// attrs returns a span's attributes as strings.
func attrs(kvs []attribute.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// checkAttrs checks that a span has the attributes of want with their
// values, and none of absent.
func checkAttrs(t *testing.T, got map[string]string, want map[string]string, absent []string) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("attribute %s = %q (present %v), want %q", k, g, ok, w)
		}
	}
	for _, k := range absent {
		if g, ok := got[k]; ok {
			t.Errorf("attribute %s = %q, want none", k, g)
		}
	}
}

// checkNoSecrets fails when any attribute of the span, of its events or of
// its resource, or its name, carries a descriptor value.
func checkNoSecrets(t *testing.T, s tracetest.SpanStub) {
	t.Helper()
	texts := []string{s.Name, s.Status.Description}
	add := func(kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			texts = append(texts, string(kv.Key), kv.Value.String())
		}
	}
	add(s.Attributes)
	for _, e := range s.Events {
		texts = append(texts, e.Name)
		add(e.Attributes)
	}
	add(s.Resource.Attributes())
	for _, txt := range texts {
		for _, secret := range secrets {
			if strings.Contains(txt, secret) {
				t.Errorf("span %q carries the descriptor value %q in %q", s.Name, secret, txt)
			}
		}
	}
}

// checkParent checks that s continues the test's parent trace, or, when
// wantParent is false, that it starts a trace of its own.
func checkParent(t *testing.T, s tracetest.SpanStub, wantParent bool) {
	t.Helper()
	if !wantParent {
		if s.Parent.IsValid() {
			t.Errorf("span %q has parent %v, want a root span", s.Name, s.Parent.SpanID())
		}
		return
	}
	if got, want := s.Parent.TraceID().String(), parentTrace; got != want {
		t.Errorf("parent trace %s, want %s", got, want)
	}
	if got, want := s.Parent.SpanID().String(), parentSpan; got != want {
		t.Errorf("parent span %s, want %s", got, want)
	}
	if !s.Parent.IsRemote() {
		t.Errorf("parent is not remote")
	}
	if got, want := s.SpanContext.TraceID().String(), parentTrace; got != want {
		t.Errorf("span's trace %s, want the parent's %s", got, want)
	}
}

func descs(pairs ...string) []*rlv3.RateLimitDescriptor {
	var ds []*rlv3.RateLimitDescriptor
	for i := 0; i+1 < len(pairs); i += 2 {
		ds = append(ds, &rlv3.RateLimitDescriptor{Entries: entries(pairs[i], pairs[i+1])})
	}
	return ds
}

// TestTraceGRPC drives ShouldRateLimit through a real gRPC server on
// loopback, with a client that sends a traceparent as Envoy does, and
// checks the span the server records for each call.
func TestTraceGRPC(t *testing.T) {
	t.Parallel()
	tp, exp := newRecorder(t)
	s := newTestServer(t, tracedRules)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(s.GRPCServerOptions(), TraceGRPC(tp))...)
	s.RegisterGRPC(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := pb.NewRateLimitServiceClient(conn)

	const method = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	// In order: the second call spends what the first left.
	tests := []struct {
		name        string
		traceparent string // "" sends none
		req         *pb.RateLimitRequest
		wantCode    codes.Code
		wantSpan    bool
		wantParent  bool
		want        map[string]string
		absent      []string
		wantStatus  otelcodes.Code
	}{
		{
			name: "allowed, child of the caller", traceparent: traceparent("01"),
			req:      &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("remote_address", "198.51.100.23", "api_key", "sk-live-4f1c9a")},
			wantSpan: true, wantParent: true,
			want: map[string]string{"ratelimit.domain": "edge", "ratelimit.descriptors": "2", "ratelimit.overall_code": "OK",
				"rpc.system.name": "grpc", "rpc.method": method, "rpc.response.status_code": "OK"},
			absent: []string{"error.type"},
		},
		{
			name: "over the limit", traceparent: traceparent("01"),
			req:      &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("remote_address", "198.51.100.23")},
			wantSpan: true, wantParent: true,
			want:   map[string]string{"ratelimit.domain": "edge", "ratelimit.descriptors": "1", "ratelimit.overall_code": "OVER_LIMIT", "rpc.response.status_code": "OK"},
			absent: []string{"error.type"},
		},
		{
			name:     "no traceparent: a trace of its own",
			req:      &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("remote_address", "198.51.100.24")},
			wantSpan: true,
			want:     map[string]string{"ratelimit.domain": "edge", "ratelimit.overall_code": "OK"},
		},
		{
			name: "a malformed traceparent is ignored", traceparent: "00-zz-" + parentSpan + "-01",
			req:      &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("api_key", "sk-live-77e0b2")},
			wantSpan: true,
			want:     map[string]string{"ratelimit.overall_code": "OK"},
		},
		{
			name: "invalid request: the caller's error, no overall code", traceparent: traceparent("01"),
			req:      &pb.RateLimitRequest{Domain: "edge"},
			wantCode: codes.InvalidArgument, wantSpan: true, wantParent: true,
			want:   map[string]string{"ratelimit.domain": "edge", "ratelimit.descriptors": "0", "rpc.response.status_code": "INVALID_ARGUMENT", "error.type": "INVALID_ARGUMENT"},
			absent: []string{"ratelimit.overall_code"},
		},
		{
			name: "the caller did not sample its trace: no span", traceparent: traceparent("00"),
			req: &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("remote_address", "198.51.100.25")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.traceparent != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", tc.traceparent)
			}
			_, err := client.ShouldRateLimit(ctx, tc.req)
			if got, want := status.Code(err), tc.wantCode; got != want {
				t.Fatalf("ShouldRateLimit: code %v (%v), want %v", got, err, want)
			}
			want := 0
			if tc.wantSpan {
				want = 1
			}
			spans := spansAfter(t, exp, want)
			if got := len(spans); got != want {
				t.Fatalf("%d spans, want %d: %v", got, want, spans)
			}
			if !tc.wantSpan {
				return
			}
			sp := spans[0]
			if got, want := sp.Name, method; got != want {
				t.Errorf("span name %q, want %q", got, want)
			}
			if got, want := sp.SpanKind, trace.SpanKindServer; got != want {
				t.Errorf("span kind %v, want %v", got, want)
			}
			if got, want := sp.Status.Code, tc.wantStatus; got != want {
				t.Errorf("span status %v, want %v", got, want)
			}
			checkParent(t, sp, tc.wantParent)
			checkAttrs(t, attrs(sp.Attributes), tc.want, tc.absent)
			checkNoSecrets(t, sp)
		})
	}

	t.Run("health checks are not traced", func(t *testing.T) {
		exp.Reset()
		ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent("01"))
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if spans := spansAfter(t, exp, 0); len(spans) != 0 {
			t.Errorf("%d spans for a health check, want none: %v", len(spans), spans[0].Name)
		}
	})
}

// TestTraceHTTP sends /json and /auth requests with a traceparent to a
// real HTTP server on loopback, mounted as serve mounts them, and checks
// the spans: their parent, name and attributes, and that the client's
// address, API key and original path — the descriptor values — are not
// among them.
func TestTraceHTTP(t *testing.T) {
	t.Parallel()
	tp, exp := newRecorder(t)
	s := newTestServer(t, tracedRules)
	ip, err := clientip.New(clientip.TrustProxies("127.0.0.1/32"), clientip.FromHeader("X-Forwarded-For"))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := s.AuthHandler(HTTPRules{Domain: "edge", Descriptors: []string{"remote_address", "api_key=header:X-API-Key", "path"}, ClientIP: ip})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", s.Handler())
	mux.Handle("/auth", auth)
	ts := httptest.NewServer(TraceHTTP(tp, mux))
	t.Cleanup(ts.Close)

	jsonBody := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.23"}]},{"entries":[{"key":"api_key","value":"sk-live-4f1c9a"}]}]}`
	authHeaders := map[string]string{"X-Forwarded-For": "198.51.100.24", "X-API-Key": "sk-live-77e0b2",
		"X-Original-URI": "/users/alice-private-path?token=sk-live-77e0b2", "X-Original-Method": "GET"}
	// In order: the second /json spends what the first left.
	tests := []struct {
		name        string
		method      string
		path        string
		body        string
		headers     map[string]string
		traceparent string
		wantStatus  int
		wantSpan    string // "" for none
		wantParent  bool
		want        map[string]string
	}{
		{
			name: "json allowed", method: "POST", path: "/json", body: jsonBody, traceparent: traceparent("01"),
			wantStatus: 200, wantSpan: "POST /json", wantParent: true,
			want: map[string]string{"http.request.method": "POST", "http.route": "/json", "http.response.status_code": "200",
				"ratelimit.domain": "edge", "ratelimit.descriptors": "2", "ratelimit.overall_code": "OK"},
		},
		{
			name: "json over the limit", method: "POST", path: "/json", body: jsonBody, traceparent: traceparent("01"),
			wantStatus: 429, wantSpan: "POST /json", wantParent: true,
			want: map[string]string{"http.response.status_code": "429", "ratelimit.overall_code": "OVER_LIMIT"},
		},
		{
			name: "json invalid", method: "POST", path: "/json", body: `{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"sk-live-4f1c9a"}]}],"bogus":1}`,
			wantStatus: 400, wantSpan: "POST /json",
			want: map[string]string{"http.response.status_code": "400"},
		},
		{
			name: "auth", method: "GET", path: "/auth", headers: authHeaders, traceparent: traceparent("01"),
			wantStatus: 200, wantSpan: "GET /auth", wantParent: true,
			want: map[string]string{"http.request.method": "GET", "http.route": "/auth", "http.response.status_code": "200",
				"ratelimit.domain": "edge", "ratelimit.descriptors": "3", "ratelimit.overall_code": "OK"},
		},
		{
			name: "metrics are not traced", method: "GET", path: "/metrics", traceparent: traceparent("01"),
			wantStatus: 200,
		},
		{
			name: "json, the caller did not sample", method: "POST", path: "/json", body: jsonBody, traceparent: traceparent("00"),
			wantStatus: 429,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			req, err := http.NewRequest(tc.method, ts.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			if tc.traceparent != "" {
				req.Header.Set("traceparent", tc.traceparent)
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got, want := resp.StatusCode, tc.wantStatus; got != want {
				t.Fatalf("status %d, want %d", got, want)
			}
			want := 0
			if tc.wantSpan != "" {
				want = 1
			}
			spans := spansAfter(t, exp, want)
			if got := len(spans); got != want {
				t.Fatalf("%d spans, want %d", got, want)
			}
			if want == 0 {
				return
			}
			sp := spans[0]
			if got, want := sp.Name, tc.wantSpan; got != want {
				t.Errorf("span name %q, want %q", got, want)
			}
			if got, want := sp.SpanKind, trace.SpanKindServer; got != want {
				t.Errorf("span kind %v, want %v", got, want)
			}
			if got, want := sp.Status.Code, otelcodes.Unset; got != want {
				t.Errorf("span status %v, want %v", got, want)
			}
			checkParent(t, sp, tc.wantParent)
			checkAttrs(t, attrs(sp.Attributes), tc.want, nil)
			checkNoSecrets(t, sp)
		})
	}
}

// TestTraceDecision checks what the decision records on the request's
// span, for every transport: the domain (bounded, valid UTF-8), the number
// of descriptors and the overall code, and nothing of the descriptors.
func TestTraceDecision(t *testing.T) {
	t.Parallel()
	tp, exp := newRecorder(t)
	long := strings.Repeat("d", 300)
	tests := []struct {
		name    string
		req     *pb.RateLimitRequest
		overall pb.RateLimitResponse_Code
		want    map[string]string
	}{
		{"ok", &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("remote_address", "198.51.100.23", "api_key", "sk-live-4f1c9a")}, pb.RateLimitResponse_OK,
			map[string]string{"ratelimit.domain": "edge", "ratelimit.descriptors": "2", "ratelimit.overall_code": "OK"}},
		{"over the limit", &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("remote_address", "198.51.100.23")}, pb.RateLimitResponse_OVER_LIMIT,
			map[string]string{"ratelimit.descriptors": "1", "ratelimit.overall_code": "OVER_LIMIT"}},
		{"a long domain is cut", &pb.RateLimitRequest{Domain: long, Descriptors: descs("k", "v")}, pb.RateLimitResponse_OK,
			map[string]string{"ratelimit.domain": long[:maxDomainLen]}},
		{"a domain of invalid UTF-8 is made valid", &pb.RateLimitRequest{Domain: "ed\xffge", Descriptors: descs("k", "v")}, pb.RateLimitResponse_OK,
			map[string]string{"ratelimit.domain": "ed\uFFFDge"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			ctx, span := tp.Tracer("test").Start(context.Background(), "decision")
			traceDecision(ctx, tc.req, tc.overall)
			span.End()
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			checkAttrs(t, attrs(spans[0].Attributes), tc.want, nil)
			checkNoSecrets(t, spans[0])
		})
	}
}

// TestTraceStoreFailure checks the event a failed store call adds to the
// request's span.
func TestTraceStoreFailure(t *testing.T) {
	t.Parallel()
	tp, exp := newRecorder(t)
	tests := []struct {
		name string
		o    engine.Outcome
		err  error
		want map[string]string
	}{
		{"timeout, open", engine.FailedOpen, context.DeadlineExceeded,
			map[string]string{"ratelimit.answer": "fail_open", "error.type": "timeout", "exception.message": "context deadline exceeded"}},
		{"error, closed", engine.FailedClosed, errors.New("redisstore: token_bucket: dial tcp 127.0.0.1:1: connect: connection refused"),
			map[string]string{"ratelimit.answer": "fail_closed", "error.type": "store_error",
				"exception.message": "redisstore: token_bucket: dial tcp 127.0.0.1:1: connect: connection refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			ctx, span := tp.Tracer("test").Start(context.Background(), "decision")
			traceStoreFailure(ctx, tc.o, tc.err)
			traceStoreFailure(ctx, tc.o, tc.err)
			span.End()
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			evs := spans[0].Events
			if got, want := len(evs), 2; got != want {
				t.Fatalf("%d events, want %d: one per failed call", got, want)
			}
			for _, ev := range evs {
				if got, want := ev.Name, EventStoreFailure; got != want {
					t.Errorf("event %q, want %q", got, want)
				}
				checkAttrs(t, attrs(ev.Attributes), tc.want, nil)
			}
			if got, want := spans[0].Status.Code, otelcodes.Unset; got != want {
				t.Errorf("span status %v, want %v: a failure mode answered", got, want)
			}
		})
	}
}

// TestTracingOffAllocatesNothing: without a span in the context (tracing
// off, or a request not sampled), what the decision calls does not
// allocate.
func TestTracingOffAllocatesNothing(t *testing.T) {
	req := &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("remote_address", "198.51.100.23")}
	err := errors.New("redisstore: down")
	ctxs := map[string]context.Context{
		"no span": context.Background(),
		"unsampled span": trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})),
	}
	for name, ctx := range ctxs {
		allocs := testing.AllocsPerRun(100, func() {
			traceDecision(ctx, req, pb.RateLimitResponse_OK)
			traceStoreFailure(ctx, engine.FailedOpen, err)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", name, allocs)
		}
	}
}

func TestGRPCCodeName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		c    codes.Code
		want string
	}{
		{codes.OK, "OK"},
		{codes.InvalidArgument, "INVALID_ARGUMENT"},
		{codes.ResourceExhausted, "RESOURCE_EXHAUSTED"},
		{codes.DeadlineExceeded, "DEADLINE_EXCEEDED"},
		{codes.Unavailable, "UNAVAILABLE"},
	}
	for _, tc := range tests {
		if got := grpcCodeName(tc.c); got != tc.want {
			t.Errorf("grpcCodeName(%v) = %q, want %q", tc.c, got, tc.want)
		}
	}
}

// discard is a span exporter that drops what it is sent.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkTracing measures what tracing adds to one ShouldRateLimit on the
// memory store, without the network: off (no interceptor), on but not
// sampled, and sampled into a batch span processor whose exporter drops
// the spans.
func BenchmarkTracing(b *testing.B) {
	s := newTestServer(b, tracedRules)
	r := &pb.RateLimitRequest{Domain: "edge", Descriptors: descs("api_key", "sk-live-4f1c9a")}
	info := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	handler := func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*pb.RateLimitRequest))
	}
	incoming := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", traceparent("01")))
	for _, bc := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: no interceptor
		ctx     context.Context
	}{
		{"off", nil, incoming},
		{"on, not sampled", sdktrace.TraceIDRatioBased(0), context.Background()},
		{"on, sampled", sdktrace.AlwaysSample(), incoming},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			call := handler
			if bc.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sdktrace.ParentBased(bc.sampler)))
				defer tp.Shutdown(context.Background())
				icpt := traceInterceptor(tp)
				call = func(ctx context.Context, req any) (any, error) { return icpt(ctx, req, info, handler) }
			}
			for b.Loop() {
				if _, err := call(bc.ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
