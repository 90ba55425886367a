package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/tollgate/tollgate/internal/service"
)

func init() {
	register(command{
		name:    "proxy",
		summary: "a rate-limiting reverse proxy in front of any HTTP API, with the same rules files",
		run:     runProxy,
	})
}

// proxyOptions are proxy's flags: those it shares with serve, and its
// upstream, listeners and shutdown.
type proxyOptions struct {
	f             serveFlags
	upstream      *url.URL
	listen, admin string
	drainTimeout  time.Duration
	conns         connFlags
}

func runProxy(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	o, code, ok := parseProxy(args, stderr)
	if !ok {
		return code
	}
	srv, log, cleanup, err := o.f.setup(getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 1
	}
	defer cleanup()
	handler, err := o.handler(srv)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 2
	}
	pl, al, err := o.listeners()
	if err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return 1
	}
	ps := o.conns.httpServer(handler, log)
	as := o.conns.httpServer(srv.Handler(), log)
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	o.f.background(bg, srv, log)
	errc := make(chan error, 2)
	go func() { errc <- ps.Serve(pl) }()
	go func() { errc <- as.Serve(al) }()
	log.Info("listening", "http", al.Addr().String(), "proxy", pl.Addr().String(), "upstream", o.upstream.Redacted(), "domain", o.f.domain)
	o.awaitStop(ctx, errc, log)
	srv.Drain()
	o.drain(ps, as, log)
	log.Info("stopped")
	return 0
}

// parseProxy parses proxy's arguments and checks them, up to what needs
// the rules. When it reports false, proxy exits with code at once (0 for
// --help).
func parseProxy(args []string, stderr io.Writer) (o *proxyOptions, code int, ok bool) {
	fs := flag.NewFlagSet("tollgate proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o = new(proxyOptions)
	o.f.register(fs)
	o.f.registerHTTP(fs, "")
	upstream := fs.String("upstream", "", "the API to protect, such as http://127.0.0.1:9000 (required)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8000", "address the proxy listens on")
	fs.StringVar(&o.admin, "http", "127.0.0.1:8080", "address for /healthcheck, /readyz, /metrics and /json")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long requests in flight may take to finish")
	// The proxy's answers are the upstream's: a minute, as nginx's
	// proxy_read_timeout, before a slow one is cut.
	o.conns.registerHTTP(fs, time.Minute)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate proxy --upstream URL --config PATH [--domain NAME] [--descriptor SPEC]... [flags]")
		fmt.Fprintln(stderr, "\nA reverse proxy that applies the rules to every request: 429 with Retry-After and")
		fmt.Fprintln(stderr, "RateLimit headers when over the limit, the upstream's answer with the headers otherwise.")
		fs.PrintDefaults()
	}
	// The gRPC flag of serve has no use here, but scripts that share flags
	// between the two should not break on it.
	fs.String("grpc", "", "ignored (serve's gRPC address)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return nil, code, false
	}
	if err := errors.Join(o.conns.check(false, false), o.f.checkEarly()); err != nil {
		fmt.Fprintf(stderr, "tollgate proxy: %v\n", err)
		return nil, 2, false
	}
	up, err := url.Parse(*upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		fmt.Fprintf(stderr, "tollgate proxy: --upstream %q: want an http:// or https:// URL\n", *upstream)
		return nil, 2, false
	}
	o.upstream = up
	return o, 0, true
}

// handler is the proxy itself: srv's decisions on the descriptors the
// flags build from each request, in front of the upstream. Without
// --domain, rules of a single domain name it.
func (o *proxyOptions) handler(srv *service.Server) (http.Handler, error) {
	if o.f.domain == "" {
		// One domain in the rules: that is the one.
		if d := srv.Rules().DomainNames(); len(d) == 1 {
			o.f.domain = d[0]
		} else {
			return nil, fmt.Errorf("--domain is required when the rules have %d domains", len(d))
		}
	}
	rules, err := o.f.httpRules()
	if err != nil {
		return nil, err
	}
	return srv.Proxy(o.upstream, rules)
}

// listeners opens the proxy's listener and the admin one, or neither.
func (o *proxyOptions) listeners() (pl, al net.Listener, err error) {
	pl, err = net.Listen("tcp", o.listen)
	if err != nil {
		return nil, nil, err
	}
	al, err = net.Listen("tcp", o.admin)
	if err != nil {
		pl.Close()
		return nil, nil, err
	}
	return pl, al, nil
}

// awaitStop waits for ctx to end (a signal) or a listener to fail.
func (o *proxyOptions) awaitStop(ctx context.Context, errc <-chan error, log *slog.Logger) {
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining requests in flight", "drain_timeout", o.drainTimeout.String())
	case err := <-errc:
		log.Error("a listener failed; shutting down", "error", err.Error())
	}
}

// drain shuts the proxy's server ps and the admin one as down, letting
// requests in flight finish for up to --drain-timeout in all.
func (o *proxyOptions) drain(ps, as *http.Server, log *slog.Logger) {
	dctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	defer cancel()
	if err := ps.Shutdown(dctx); err != nil {
		log.Warn("requests still in flight at the drain timeout were cut", "error", err.Error())
	}
	as.Shutdown(dctx)
}
