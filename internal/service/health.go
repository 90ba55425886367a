package service

import (
	"context"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Probe checks the store every interval (with WithPing) until ctx ends,
// and keeps readiness and the tollgate_serve_store_up metric up to date.
// Store state changes are logged.
func (s *Server) Probe(ctx context.Context, interval time.Duration) {
	if s.ping == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, max(interval/2, s.timeout))
		err := s.ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		up := err == nil
		if was := s.storeUp.Swap(up); was != up {
			if up {
				s.log.Info("store reachable")
			} else {
				s.log.Error("store unreachable; answering by failure mode", "error", err.Error())
			}
		}
		s.updateReady()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Drain marks the server as shutting down: /healthcheck and /readyz fail
// and the gRPC health service says NOT_SERVING, so that load balancers
// stop sending, while requests keep being answered until the listeners
// close.
func (s *Server) Drain() {
	s.draining.Store(true)
	s.updateReady()
	s.health.Shutdown()
}

// Ready reports whether the server should get traffic, and if not, why.
func (s *Server) Ready() (bool, string) {
	switch {
	case s.draining.Load():
		return false, "shutting down"
	case s.snap.Load() == nil:
		return false, "no rules loaded"
	case !s.storeUp.Load():
		return false, "store unreachable"
	}
	return true, "ready"
}

func (s *Server) updateReady() {
	ok, _ := s.Ready()
	v, st := 0.0, healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		v, st = 1, healthpb.HealthCheckResponse_SERVING
	}
	s.m.ready.Set(v)
	up := 0.0
	if s.storeUp.Load() {
		up = 1
	}
	s.m.storeUp.Set(up)
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(pb.RateLimitService_ServiceDesc.ServiceName, st)
	s.health.SetServingStatus("ratelimit", st) // the name envoyproxy/ratelimit registers
}
