package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/config"
)

// mux is serve's HTTP handler: srv's endpoints and /auth, which builds
// descriptors from the original request as the flags say.
func (o *serveOptions) mux(srv *service.Server) (*http.ServeMux, error) {
	rules, err := o.f.httpRules()
	if err != nil {
		return nil, err
	}
	rules.URIHeader, rules.MethodHeader, rules.HeaderHelp = o.f.bounds.authHeaders()
	auth, err := srv.AuthHandler(rules)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", srv.Handler())
	mux.Handle("/auth", auth)
	return mux, nil
}

// listen opens the HTTP and gRPC listeners, or neither.
func (o *serveOptions) listen() (hl, gl net.Listener, err error) {
	hl, err = net.Listen("tcp", o.httpAddr)
	if err != nil {
		return nil, nil, err
	}
	gl, err = net.Listen("tcp", o.grpcAddr)
	if err != nil {
		hl.Close()
		return nil, nil, err
	}
	return hl, gl, nil
}

// serveDebug serves, on --debug until the returned server is closed,
// /debug/pprof and /rlconfig: the rules that rules returns (those in
// force), in envoyproxy/ratelimit's text form (config.Rules.Dump).
func (o *serveOptions) serveDebug(log *slog.Logger, rules func() *config.Rules) (*http.Server, error) {
	dl, err := net.Listen("tcp", o.debugAddr)
	if err != nil {
		return nil, err
	}
	dmux := http.NewServeMux()
	dmux.HandleFunc("/debug/pprof/", pprof.Index)
	dmux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	dmux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	dmux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		// An error is the client's connection: nothing to answer it.
		_ = rules().Dump(w)
	})
	ds := o.conns.debugServer(dmux, log)
	go ds.Serve(dl)
	log.Info("debug listening", "addr", dl.Addr().String())
	return ds, nil
}

// awaitStop waits for ctx to end (a signal) or a listener to fail, marks
// srv not ready, and keeps serving for --shutdown-delay.
func (o *serveOptions) awaitStop(ctx context.Context, errc <-chan error, srv *service.Server, log *slog.Logger) {
	select {
	case <-ctx.Done():
		// Not ready first, then say so: whoever reads the log line (an
		// operator, a test) finds /readyz already failing.
		srv.Drain()
		log.Info("shutting down: draining requests in flight", "shutdown_delay", o.shutdownDelay.String(), "drain_timeout", o.drainTimeout.String())
	case err := <-errc:
		srv.Drain()
		log.Error("a listener failed; shutting down", "error", err.Error())
	}
	if o.shutdownDelay > 0 {
		time.Sleep(o.shutdownDelay)
	}
}

// drain stops g and hs, letting requests in flight finish for up to
// --drain-timeout; it returns hs's error when some were cut. It returns by
// the drain timeout whatever the clients do: grpc-go's Stop closes every
// connection but still waits for the handshakes under way (each bounded by
// --grpc-handshake-timeout), and the process exits without them.
func (o *serveOptions) drain(g *grpc.Server, hs *http.Server) error {
	dctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	httpErr := hs.Shutdown(dctx)
	select {
	case <-stopped:
	case <-dctx.Done():
		go g.Stop()
	}
	return httpErr
}
