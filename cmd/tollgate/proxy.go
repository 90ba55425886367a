package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"time"
)

func init() {
	register(command{
		name:    "proxy",
		summary: "a rate-limiting reverse proxy in front of any HTTP API, with the same rules files",
		run:     runProxy,
	})
}

func runProxy(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tollgate proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	f.registerHTTP(fs, "")
	upstream := fs.String("upstream", "", "the API to protect, such as http://127.0.0.1:9000 (required)")
	listen := fs.String("listen", "127.0.0.1:8000", "address the proxy listens on")
	admin := fs.String("http", "127.0.0.1:8080", "address for /healthcheck, /readyz, /metrics and /json")
	drainTimeout := fs.Duration("drain-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long requests in flight may take to finish")
	var conns connFlags
	// The proxy's answers are the upstream's: a minute, as nginx's
	// proxy_read_timeout, before a slow one is cut.
	conns.registerHTTP(fs, time.Minute)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate proxy --upstream URL --config PATH [--domain NAME] [--descriptor SPEC]... [flags]")
		fmt.Fprintln(stderr, "\nA reverse proxy that applies the rules to every request: 429 with Retry-After and")
		fmt.Fprintln(stderr, "RateLimit headers when over the limit, the upstream's answer with the headers otherwise.")
		fs.PrintDefaults()
	}
	// The gRPC flag of serve has no use here, but scripts that share flags
	// between the two should not break on it.
	fs.String("grpc", "", "ignored (serve's gRPC address)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := conns.check(false, false); err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 2
	}
	up, err := url.Parse(*upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		fmt.Fprintf(stderr, "tollgate proxy: --upstream %q: want an http:// or https:// URL\n", *upstream)
		return 2
	}
	srv, log, cleanup, err := f.setup(getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 1
	}
	defer cleanup()
	if f.domain == "" {
		// One domain in the rules: that is the one.
		if d := srv.Rules().DomainNames(); len(d) == 1 {
			f.domain = d[0]
		} else {
			fmt.Fprintf(stderr, "tollgate proxy: --domain is required when the rules have %d domains\n", len(d))
			return 2
		}
	}
	rules, err := f.httpRules()
	if err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 2
	}
	handler, err := srv.Proxy(up, rules)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 2
	}
	pl, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 1
	}
	al, err := net.Listen("tcp", *admin)
	if err != nil {
		pl.Close()
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 1
	}
	ps := conns.httpServer(handler, log)
	as := conns.httpServer(srv.Handler(), log)
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	f.background(bg, srv, log)
	errc := make(chan error, 2)
	go func() { errc <- ps.Serve(pl) }()
	go func() { errc <- as.Serve(al) }()
	log.Info("listening", "http", al.Addr().String(), "proxy", pl.Addr().String(), "upstream", up.Redacted(), "domain", f.domain)
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining requests in flight", "drain_timeout", drainTimeout.String())
	case err := <-errc:
		log.Error("a listener failed; shutting down", "error", err.Error())
	}
	srv.Drain()
	dctx, cancel := context.WithTimeout(context.Background(), *drainTimeout)
	defer cancel()
	if err := ps.Shutdown(dctx); err != nil {
		log.Warn("requests still in flight at the drain timeout were cut", "error", err.Error())
	}
	as.Shutdown(dctx)
	log.Info("stopped")
	return 0
}
