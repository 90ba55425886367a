// Package service is tollgate's decision service: the rate-limit service that
// gateways call, a drop-in for envoyproxy/ratelimit.
//
// A Server holds the rules (package config) and a tollgate.Store, and
// answers:
//
//   - gRPC envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, the
//     protocol Envoy, Istio, Contour, Emissary and Envoy Gateway speak
//     (RegisterGRPC), with the grpc.health.v1 service beside it;
//   - POST /json, the same messages in protojson: 200 when OK, 429 when over
//     the limit, as envoyproxy/ratelimit answers;
//   - GET /healthcheck (200 "OK" until shutdown begins), GET /readyz (200
//     only while rules are loaded, the store answers and no shutdown has
//     begun) and GET /metrics (Prometheus) (Handler);
//   - an endpoint for nginx's auth_request and forward-auth proxies
//     (AuthHandler), and a rate-limiting reverse proxy (Proxy), which build
//     descriptors from HTTP requests.
//
// Answers carry the IETF RateLimit-Policy and RateLimit fields (and
// Retry-After when over the limit), written by headers: in
// response_headers_to_add over gRPC, as HTTP headers elsewhere.
//
// # One request
//
// For each descriptor of a request, in order, the rule is looked up
// (config.Lookup). Then rules named in another matched rule's replaces are
// dropped, exactly as envoyproxy/ratelimit does. Each remaining rule spends
// hits × cost from the counter of the request's entries — the descriptor's
// hits_addend when set (0 looks without spending), else the request's
// (0 meaning 1). Unlimited rules and descriptors without a rule answer OK
// without touching the store; a rule of requests_per_unit 0 answers
// OVER_LIMIT without touching it either.
//
// A rule of several limits (rate_limits in the rules file) spends the
// hits under all of them or none, in one store call (set.go): the store
// must be a tollgate.Combiner. The descriptor's status reports the limit
// that decided; RateLimit-Policy lists every limit.
//
// The counter of a descriptor is keyed by the domain and the request's
// entries (keys and values, escaped so that no two descriptors share one;
// a share_threshold wildcard contributes its pattern instead of the value),
// not by the rule: changing a rule's limit keeps what was spent.
//
// Every store call of a request runs under one deadline (WithTimeout, 50 ms
// by default). When the store fails or misses it, the rule's failure mode
// decides — open answers OK, closed answers OVER_LIMIT — and the answer is
// counted (outcome "fail_open" or "fail_closed") and logged, at most once
// per log interval (WithLogInterval, 10 s by default) with the number of
// events folded in. A service whose Redis is gone therefore keeps
// answering within its deadline, and /readyz says it is not ready. Once
// the deadline has passed, the request's remaining descriptors are
// answered by failure mode without a store call, so that one request
// counts at most one store timeout however many descriptors it carries.
//
// # Stream-done calls and concurrency rules
//
// Envoy calls the service a second time when a request's stream is done,
// for the route's rate limits marked apply_on_stream_done, with
// hits_addend taken from the response. A descriptor of that call carries
// the entry tollgate.phase=stream_done (PhaseKey), which the service takes
// out before matching, so that it meets the rule and counter of the
// request's start. For a rate rule the call charges its hits to the
// counter even past what is left (charge): the next request is over the
// limit. A rule with a concurrency limit (config.Concurrency) takes a slot
// at the request's start, OVER_LIMIT when none is free, and gives it back
// on the stream-done call; both name the slot with the entry
// tollgate.permit (PermitKey), the request's x-request-id, so that any
// replica can release what another took. A slot whose release never comes
// is given back when its lease ends. The slots are in the concurrency
// store (WithConcurrencyStore): Redis for slots every replica shares.
//
// # Invalid requests
//
// Whoever reaches the service can send anything, so one request is
// bounded before any rule is looked up or the store is asked: at most
// DefaultMaxDescriptors descriptors (WithMaxDescriptors) of at most
// DefaultMaxEntries entries (WithMaxEntries), a hits_addend of at most
// DefaultMaxHits (WithMaxHits), and DefaultMaxRequestBytes encoded
// (WithMaxRequestBytes; GRPCServerOptions applies it to gRPC). A
// descriptor whose own limit no store can count with is invalid too. A
// descriptor whose hits × cost exceeds what its rule can ever admit at once
// (tollgate.Limit.Capacity) is OVER_LIMIT, as envoyproxy/ratelimit answers
// it, without asking the store: an error would let a gateway that fails
// open pass it. An invalid request is refused as a whole — gRPC
// InvalidArgument, HTTP 400 (413 for a body over the size) — and counted
// in tollgate_serve_invalid_total by reason, never as a store failure and
// never answered by a failure mode.
//
// The auth endpoint reads the original request from one configured header
// pair only (HTTPRules.URIHeader and MethodHeader), and its path is
// normalized (NormalizePath) so that one resource spelt differently is one
// counter.
package service
