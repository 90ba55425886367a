package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
)

func init() {
	register(command{
		name:    "serve",
		summary: "the decision service: Envoy's rate limit service (gRPC), /json, /metrics",
		run:     runServe,
	})
}

// serveOptions are serve's flags: those it shares with proxy, and its
// listeners and shutdown.
type serveOptions struct {
	f                             serveFlags
	httpAddr, grpcAddr, debugAddr string
	listenAll                     bool
	drainTimeout, shutdownDelay   time.Duration
	conns                         connFlags
	tracing                       tracingFlags
	tls                           tlsFlags   // tls.go
	admin                         adminFlags // admin.go
}

func runServe(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	o, code, ok := parseServe(args, getenv, stderr)
	if !ok {
		return code
	}
	srv, log, cleanup, err := o.f.setup(getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		if strings.HasPrefix(err.Error(), "--") {
			return 2
		}
		return 1
	}
	defer cleanup()
	logEnvoyEnv(log, getenv)
	tr, err := o.tracing.start(log)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	}
	// Runs after the drain below: the last requests' spans are sent too.
	defer tr.shutdown(o.drainTimeout, log)
	mux, err := o.mux(srv)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 2
	}
	tlsOn, err := o.tls.build(log, o.f.logInterval)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 2
	}
	// What keeps the rules current starts before the listeners (xdsflags.go).
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	o.f.background(bg, srv, log)
	o.f.extra.stats.run(bg)
	if !o.f.xds.awaitFirst(ctx, log) {
		return 0
	}
	hl, gl, err := o.listen()
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	}
	hl = tlsOn.httpListener(hl)
	// The stream workers are set in connFlags.grpcOptions.
	copts, err := o.conns.grpcOptions(srv.Registry())
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	}
	gopts := append(append(append(append(copts, srv.GRPCServerOptions()...), o.f.extra.stats.grpcOptions()...), tr.grpcOptions()...), tlsOn.grpcOptions()...)
	g := grpc.NewServer(gopts...)
	srv.RegisterGRPC(g)
	hs := o.conns.httpServer(tr.handler(mux), log)

	errc := make(chan error, 2)
	go func() { errc <- g.Serve(gl) }()
	go func() { errc <- hs.Serve(hl) }()
	if o.debugAddr != "" {
		ds, err := o.serveDebug(log, srv.Rules)
		if err != nil {
			fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
			return 1
		}
		defer ds.Close()
	}
	if as, err := o.admin.serve(srv, &o.conns, log); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	} else if as != nil {
		defer as.Close()
	}
	if ps, err := o.f.extra.servePrometheus(srv, &o.conns, log); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	} else if ps != nil {
		defer ps.Close()
	}
	log.Info("listening", "http", hl.Addr().String(), "grpc", gl.Addr().String())

	o.awaitStop(ctx, errc, srv, log)
	httpErr := o.drain(g, hs)
	stopBG()
	if httpErr != nil {
		log.Warn("HTTP requests still in flight at the drain timeout were cut", "error", httpErr.Error())
	}
	log.Info("stopped")
	return 0
}

// parseServe parses serve's arguments, over the flag values taken from
// envoyproxy/ratelimit's environment (see envoyenv.go), and fills in the
// default addresses. When it reports false, serve exits with code at once
// (0 for --help).
func parseServe(args []string, getenv env, stderr io.Writer) (o *serveOptions, code int, ok bool) {
	fs := flag.NewFlagSet("tollgate serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o = new(serveOptions)
	o.f.register(fs)
	o.f.registerHTTP(fs, "127.0.0.0/8,::1/128")
	o.f.bounds.registerAuth(fs)
	fs.StringVar(&o.httpAddr, "http", "", "HTTP address for /json, /auth, /healthcheck, /readyz, /metrics (default 127.0.0.1:8080; :8080 with --listen-all)")
	fs.StringVar(&o.grpcAddr, "grpc", "", "gRPC address for envoy.service.ratelimit.v3.RateLimitService (default 127.0.0.1:8081; :8081 with --listen-all)")
	fs.BoolVar(&o.listenAll, "listen-all", false, "listen on every interface for the default addresses, not only on loopback")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long requests in flight may take to finish")
	fs.StringVar(&o.debugAddr, "debug", "", "address for /debug/pprof and /rlconfig, the rules in force (off by default; keep it on loopback)")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 0, "on SIGTERM or SIGINT, how long to keep serving with /readyz failing before closing the listeners (for load balancers to notice)")
	o.conns.registerHTTP(fs, 30*time.Second)
	o.conns.registerGRPC(fs)
	o.conns.registerDebug(fs)
	o.tracing.register(fs)
	o.tls.register(fs)
	o.f.extra.register(fs)
	o.f.xds.register(fs)
	o.admin.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate serve --config PATH | --xds HOST:PORT [--redis URL] [flags]")
		fmt.Fprintln(stderr, "\nA drop-in for envoyproxy/ratelimit: the same gRPC protocol and rules files.")
		fs.PrintDefaults()
	}
	if _, err := applyEnvoyEnv(fs, getenv); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: envoyproxy/ratelimit's environment (see docs/envoy-environment.md): %v\n", err)
		return nil, 2, false
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return nil, code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tollgate serve: unexpected argument %q\n", fs.Arg(0))
		return nil, 2, false
	}
	if err := o.f.checkEarly(); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return nil, 2, false
	}
	if err := o.f.extra.check(); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return nil, 2, false
	}
	if err := o.f.extra.stats.readEnv(getenv); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return nil, 2, false
	}
	if err := errors.Join(o.conns.check(true, o.debugAddr != ""), o.tls.check(), o.admin.check()); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return nil, 2, false
	}
	if err := o.tracing.check(); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return nil, 2, false
	}
	host := "127.0.0.1"
	if o.listenAll {
		host = ""
	}
	if o.httpAddr == "" {
		o.httpAddr = net.JoinHostPort(host, "8080")
	}
	if o.grpcAddr == "" {
		o.grpcAddr = net.JoinHostPort(host, "8081")
	}
	return o, 0, true
}
