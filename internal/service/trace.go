package service

import (
	"context"
	"net/http"
	"strings"
	"unicode"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/door/engine"
)

// Tracing
//
// TraceGRPC and TraceHTTP make one OpenTelemetry span of every decision
// request: ShouldRateLimit over gRPC, POST /json and the auth endpoint
// over HTTP. The span continues the caller's trace when the request
// carries a W3C traceparent header (gRPC metadata or HTTP header), so
// that in a trace the decision shows as a child of the gateway's span.
//
// A span says which request it was, never whom it was about: it carries
// the domain, the number of descriptors, the overall code, the transport's
// status and one event per failed store call (with how the failure mode
// answered and the store's error), and never a descriptor's key or value,
// the counter's key, a header, the client's address or a query string.
// Descriptor values are API keys, user ids and client addresses; a trace
// backend is rarely a place they may be kept.
//
// When tracing is off neither is installed: a request then carries no
// span, and what the decision records (traceDecision, traceStoreFailure)
// finds the context's no-op span and returns at once, allocating nothing.

// tracerName is the instrumentation scope of the service's spans. It stays
// the name spans have always carried, whatever package the service lives in:
// trace queries and dashboards select spans by it.
const tracerName = "github.com/tollgate/tollgate/server"

// The attributes a decision span carries besides the transport's.
const (
	// AttrDomain is the span attribute holding the request's domain.
	AttrDomain = attribute.Key("ratelimit.domain")
	// AttrDescriptors is the span attribute holding how many descriptors
	// the request carried.
	AttrDescriptors = attribute.Key("ratelimit.descriptors")
	// AttrOverallCode is the span attribute holding the overall code of
	// the answer: OK or OVER_LIMIT. A request refused as invalid has none.
	AttrOverallCode = attribute.Key("ratelimit.overall_code")
	// EventStoreFailure is the name of the span event added for each
	// store call that failed or missed its deadline; its attributes are
	// ratelimit.answer, how the rule's failure mode answered (fail_open:
	// OK, fail_closed: OVER_LIMIT), error.type (timeout or store_error) and
	// exception.message (the store's error, which names no key).
	EventStoreFailure = "ratelimit.store_failure"
)

// maxDomainLen bounds the domain recorded on a span: the domain comes from
// the caller, and a span is kept and sent far beyond the request.
const maxDomainLen = 256

// traceContext reads the W3C traceparent and tracestate of incoming
// requests. It is the only propagator: baggage is not read, since nothing
// the service does depends on it.
var traceContext propagation.TraceContext

// TraceGRPC returns the gRPC server option that makes a span of every
// ShouldRateLimit call, from tp's tracer. The span is named after the
// method ("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
// is of kind server, and is the child of the caller's span when the call's
// metadata carries a traceparent. Other methods of the server (the health
// service) are not traced. The option chains an interceptor, so it
// combines with any other.
func TraceGRPC(tp trace.TracerProvider) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(traceInterceptor(tp))
}

// traceInterceptor is TraceGRPC's interceptor.
func traceInterceptor(tp trace.TracerProvider) grpc.UnaryServerInterceptor {
	tr := tp.Tracer(tracerName)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		rreq, ok := req.(*pb.RateLimitRequest)
		if !ok {
			return handler(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = traceContext.Extract(ctx, metadataCarrier(md))
		method := strings.TrimPrefix(info.FullMethod, "/")
		ctx, span := tr.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.RPCSystemNameGRPC, semconv.RPCMethod(method)))
		defer span.End()
		if span.IsRecording() {
			span.SetAttributes(requestAttrs(rreq)...)
		}
		resp, err := handler(ctx, req)
		if !span.IsRecording() {
			return resp, err
		}
		code := status.Code(err)
		span.SetAttributes(semconv.RPCResponseStatusCodeKey.String(grpcCodeName(code)))
		if err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(grpcCodeName(code)))
			if serverFault(code) {
				span.SetStatus(codes.Error, code.String())
			}
		} else if r, ok := resp.(*pb.RateLimitResponse); ok {
			traceDecision(ctx, rreq, r.GetOverallCode())
		}
		return resp, err
	}
}

// serverFault reports whether a gRPC code is the server's failure rather
// than the caller's, which is when the OpenTelemetry conventions mark a
// server span as an error. An invalid request (InvalidArgument) or one
// over the size bound (ResourceExhausted) is the caller's.
func serverFault(c grpccodes.Code) bool {
	switch c {
	case grpccodes.Unknown, grpccodes.DeadlineExceeded, grpccodes.Unimplemented,
		grpccodes.Internal, grpccodes.Unavailable, grpccodes.DataLoss:
		return true
	}
	return false
}

// grpcCodeName is the name of c as the gRPC protocol spells it
// (INVALID_ARGUMENT), which is what rpc.response.status_code holds.
func grpcCodeName(c grpccodes.Code) string {
	s := c.String() // "InvalidArgument", "OK", "Code(42)"
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) && unicode.IsLower(rune(s[i-1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// metadataCarrier lets the propagator read gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// TraceHTTP returns h with a span, from tp's tracer, around each decision
// request it serves: POST /json and /auth (the path serve mounts the auth
// endpoint on). The span is named after the method and the route ("POST
// /json"), is of kind server, and is the child of the caller's span when
// the request carries a traceparent header. Other paths (/metrics, the
// health checks, the proxy's traffic) pass through untraced.
//
// The span's domain, descriptors and overall code come from the server as
// it decides; TraceHTTP itself records the method, the route and the
// response's status, and marks the span as an error for a 5xx status.
func TraceHTTP(tp trace.TracerProvider, h http.Handler) http.Handler {
	tr := tp.Tracer(tracerName)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := r.URL.Path
		if route != "/json" && route != "/auth" {
			h.ServeHTTP(w, r)
			return
		}
		method := httpMethod(r.Method)
		ctx := traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tr.Start(ctx, method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(method), semconv.HTTPRoute(route)))
		defer span.End()
		if !span.IsRecording() {
			h.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(ctx))
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(code))
		if code >= 500 {
			span.SetAttributes(semconv.ErrorTypeKey.String(http.StatusText(code)))
			span.SetStatus(codes.Error, http.StatusText(code))
		}
	})
}

// httpMethod is m when it is a standard method, else "_OTHER", as the
// conventions say: a client must not be able to name spans at will.
func httpMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// requestAttrs are the attributes of req a span may carry: its domain
// (bounded, valid UTF-8) and how many descriptors it has — nothing of the
// descriptors themselves.
func requestAttrs(req *pb.RateLimitRequest) []attribute.KeyValue {
	d := req.GetDomain()
	if len(d) > maxDomainLen {
		d = d[:maxDomainLen]
	}
	// A domain from a query string may be any bytes; an invalid string
	// would make the exporter drop the whole batch it is in.
	d = strings.ToValidUTF8(d, "\uFFFD")
	return []attribute.KeyValue{AttrDomain.String(d), AttrDescriptors.Int(len(req.GetDescriptors()))}
}

// traceDecision records a decided request on the span of ctx, if it is
// being recorded: the request's domain and number of descriptors, and the
// overall code. The decision calls it once per request, for every
// transport; when tracing is off it costs one context lookup.
func traceDecision(ctx context.Context, req *pb.RateLimitRequest, overall pb.RateLimitResponse_Code) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(append(requestAttrs(req), AttrOverallCode.String(overall.String()))...)
}

// traceStoreFailure adds an EventStoreFailure event to the span of ctx, if
// it is being recorded, for a store call that failed with err and was
// answered by the rule's failure mode with outcome o.
func traceStoreFailure(ctx context.Context, o engine.Outcome, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	kind := "store_error"
	if engine.IsTimeout(ctx, err) {
		kind = "timeout"
	}
	span.AddEvent(EventStoreFailure, trace.WithAttributes(
		attribute.String("ratelimit.answer", o.String()),
		semconv.ErrorTypeKey.String(kind),
		semconv.ExceptionMessage(strings.ToValidUTF8(err.Error(), "\uFFFD")),
	))
}
