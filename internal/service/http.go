package service

import (
	"errors"
	"io"
	"net/http"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// Handler returns the HTTP API: POST /json, GET /healthcheck, GET /readyz
// and GET /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /json", s.serveJSON)
	mux.HandleFunc("GET /healthcheck", s.serveHealth)
	mux.HandleFunc("GET /readyz", s.serveReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	return mux
}

// RegisterGRPC registers the rate-limit service and the grpc.health.v1
// service (SERVING while ready) on g.
func (s *Server) RegisterGRPC(g *grpc.Server) {
	pb.RegisterRateLimitServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// serveJSON is envoyproxy/ratelimit's /json: a RateLimitRequest in
// protojson in, a RateLimitResponse out, 200 when OK and 429 when over the
// limit; 400 for a body that is not a valid request and 413 for one over
// the size bound (WithMaxRequestBytes), which is read no further.
func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.max.bytes)))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.countInvalid(apiJSON, invalidTooLarge)
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		s.countInvalid(apiJSON, invalidRequest)
		http.Error(w, "cannot read request body", http.StatusBadRequest)
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		s.countInvalid(apiJSON, invalidRequest)
		http.Error(w, "invalid RateLimitRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, h, err := s.decide(r.Context(), apiJSON, &req, false)
	if err != nil {
		http.Error(w, status.Convert(err).Message(), http.StatusBadRequest)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, "cannot encode the response", http.StatusInternalServerError)
		return
	}
	for k, v := range h {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// serveHealth is envoyproxy/ratelimit's /healthcheck: 200 "OK" while the
// process serves, 500 once shutdown has begun. It does not fail when the
// store is away — the service still answers, by failure mode — see /readyz.
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "shutting down", http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "OK")
}

// serveReady is 200 "ready" when rules are loaded, the store answers and no
// shutdown has begun; 503 with the reason otherwise.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	ok, why := s.Ready()
	if !ok {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, why)
}
