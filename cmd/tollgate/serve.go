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
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

func init() {
	register(command{
		name:    "serve",
		summary: "the decision service: Envoy's rate limit service (gRPC), /json, /metrics",
		run:     runServe,
	})
}

// serveFlags are the flags serve and proxy share.
type serveFlags struct {
	config      string
	redis       string
	redisPwFile string
	redisPrefix string
	pipeline    time.Duration
	timeout     time.Duration
	failureMode string
	shadow      bool
	watch       bool
	rulesFiles  rulesFileFlags
	envoy       envoyFlags
	logFormat   string
	logLevel    string
	logInterval time.Duration
	headers     string
	// how HTTP requests become descriptors (the auth endpoint, the proxy)
	domain      string
	descriptors multiFlag
	trusted     string
	ipHeader    string
	bounds      requestBounds
	redisTLS    redisTLSFlags // tls.go
	// envoy's Prometheus listener and local cache (serve only)
	extra envoyExtras
}

// requestBounds are the flags bounding one request to the decision service
// and naming the auth endpoint's headers (see docs/operations.md,
// Hardening).
type requestBounds struct {
	descriptors, entries, hits, bytes int
	uriHeader, methodHeader           string
}

func (b *requestBounds) register(fs *flag.FlagSet) {
	fs.IntVar(&b.descriptors, "max-descriptors", service.DefaultMaxDescriptors, "most descriptors in one request; more is invalid (gRPC InvalidArgument, HTTP 400)")
	fs.IntVar(&b.entries, "max-entries", service.DefaultMaxEntries, "most entries in one descriptor; more is invalid")
	fs.IntVar(&b.hits, "max-hits", service.DefaultMaxHits, "largest hits_addend a caller may send; more is invalid (a sliding_window_log rule writes one entry per hit)")
	fs.IntVar(&b.bytes, "max-request-bytes", service.DefaultMaxRequestBytes, "largest gRPC message or /json body; more is refused (ResourceExhausted, HTTP 413)")
}

// registerAuth registers the flags naming the headers the auth endpoint
// reads the original request from.
func (b *requestBounds) registerAuth(fs *flag.FlagSet) {
	fs.StringVar(&b.uriHeader, "auth-uri-header", service.DefaultURIHeader, "/auth: the header the proxy passes the original request's URI in, and the only one read (X-Forwarded-Uri behind Traefik or Caddy)")
	fs.StringVar(&b.methodHeader, "auth-method-header", service.DefaultMethodHeader, "/auth: the header the proxy passes the original request's method in, and the only one read (X-Forwarded-Method behind Traefik or Caddy)")
}

func (b *requestBounds) options() ([]service.Option, error) {
	for _, v := range []struct {
		name string
		n    int
	}{{"--max-descriptors", b.descriptors}, {"--max-entries", b.entries}, {"--max-hits", b.hits}, {"--max-request-bytes", b.bytes}} {
		if v.n <= 0 {
			return nil, fmt.Errorf("%s %d: want a positive number", v.name, v.n)
		}
	}
	return []service.Option{service.WithMaxDescriptors(b.descriptors), service.WithMaxEntries(b.entries),
		service.WithMaxHits(b.hits), service.WithMaxRequestBytes(b.bytes)}, nil
}

// multiFlag is a flag that may be given several times.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// registerHTTP registers the flags that say how HTTP requests become
// descriptors; trustedDefault is the default of --trusted-proxies.
func (f *serveFlags) registerHTTP(fs *flag.FlagSet, trustedDefault string) {
	fs.StringVar(&f.domain, "domain", "", "domain of the descriptors built from HTTP requests")
	fs.Var(&f.descriptors, "descriptor", "a descriptor built from HTTP requests, repeatable: entries 'remote_address', 'path', 'method', 'header:NAME', each optionally 'key=...', comma-separated; e.g. 'remote_address' or 'api_key=header:X-API-Key,path' (default remote_address)")
	fs.StringVar(&f.trusted, "trusted-proxies", trustedDefault, "comma-separated CIDRs of proxies whose client-address header is believed")
	fs.StringVar(&f.ipHeader, "client-ip-header", "X-Forwarded-For", "the header trusted proxies put the client's address in: X-Forwarded-For, Forwarded or X-Real-IP")
}

// httpRules builds the service.HTTPRules of the flags.
func (f *serveFlags) httpRules() (service.HTTPRules, error) {
	var opts []clientip.Option
	if f.trusted != "" {
		opts = append(opts, clientip.TrustProxies(strings.Split(f.trusted, ",")...))
	}
	opts = append(opts, clientip.FromHeader(f.ipHeader))
	ip, err := clientip.New(opts...)
	if err != nil {
		return service.HTTPRules{}, fmt.Errorf("--trusted-proxies/--client-ip-header: %w", err)
	}
	for _, d := range f.descriptors {
		if err := service.ParseDescriptorSpec(d); err != nil {
			return service.HTTPRules{}, fmt.Errorf("--descriptor: %w", err)
		}
	}
	return service.HTTPRules{Domain: f.domain, Descriptors: f.descriptors, ClientIP: ip}, nil
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "rules: a YAML file or a directory of them, in envoyproxy/ratelimit's format (required)")
	fs.StringVar(&f.redis, "redis", "", "Redis URL: redis://, rediss://, redis+sentinel://, redis+cluster:// (default: $REDIS_URL, else the embedded memory store, one instance)")
	fs.StringVar(&f.redisPwFile, "redis-password-file", "", "file whose first line is the Redis password, replacing the URL's (for Sentinel, the master's); default: the --redis URL's, else $REDIS_AUTH, else $REDIS_URL's")
	fs.StringVar(&f.redisPrefix, "redis-prefix", "tollgate:", "prefix of every Redis key")
	fs.DurationVar(&f.pipeline, "redis-pipeline", 50*time.Microsecond, "gather concurrent decisions for up to this long (or 64 of them) and send them to Redis as one pipeline, each still its own script call bounded by --timeout; 0 sends each alone")
	fs.DurationVar(&f.timeout, "timeout", enforce.DefaultTimeout, "deadline of a request's store calls; past it, each rule's failure mode answers")
	fs.StringVar(&f.failureMode, "failure-mode", "open", "what rules without failure_mode answer when the store fails: open (OK) or closed (OVER_LIMIT)")
	fs.BoolVar(&f.shadow, "shadow-mode", false, "global shadow mode: decide and count, but always answer OK")
	fs.BoolVar(&f.watch, "watch", true, "reload the rules when their files change (SIGHUP always reloads)")
	f.rulesFiles.register(fs)
	f.envoy.register(fs)
	fs.StringVar(&f.headers, "headers", "draft", "rate-limit header fields in answers: draft (IETF RateLimit-Policy and RateLimit), ratelimit (RateLimit-Limit/-Remaining/-Reset), x-ratelimit, a comma-separated mix, all or none; Retry-After comes with every one")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.logInterval, "log-interval", enforce.DefaultLogInterval, "log store failures and the Redis client's own lines at most once per this long, each line saying how many were left out (similar_events_not_logged); 0 logs every one")
	f.bounds.register(fs)
	f.redisTLS.register(fs)
}

// setup builds the logger, the store and the server from the flags, loads
// the rules, and returns a cleanup function.
func (f *serveFlags) setup(getenv env, stderr io.Writer) (*service.Server, *slog.Logger, func(), error) {
	log, err := f.logger(stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	if f.config == "" {
		return nil, nil, nil, errors.New("--config is required: a rules file or directory (see examples/ratelimit.yaml)")
	}
	opts, err := f.serverOptions()
	if err != nil {
		return nil, nil, nil, err
	}
	rules, err := config.Load(f.config, f.rulesFiles.options()...)
	if err != nil {
		return nil, nil, nil, err
	}
	target, err := resolveRedis(f.redis, f.redisPwFile, envoyRedisEnv(getenv))
	if err != nil {
		return nil, nil, nil, err
	}
	if target.tls, err = f.redisTLS.options(target.url, log); err != nil {
		return nil, nil, nil, err
	}
	tuneGC(getenv, target.url == "", log)
	store, err := f.store(target, log)
	if err != nil {
		return nil, nil, nil, err
	}
	timeout := f.timeout
	if target.url == "" {
		// The memory store never waits on I/O (a decision takes a
		// microsecond), so a deadline would only cost a timer per request.
		timeout = 0
	}
	srv, err := service.New(store.Store, append(opts,
		service.WithTimeout(timeout), service.WithLogger(log), service.WithPing(store.ping), service.WithConcurrencyStore(store.conc),
		service.WithParallelDescriptors(store.ping != nil))...) // a remote store: one round trip per request
	if err != nil {
		store.cleanup()
		return nil, nil, nil, err
	}
	srv.SetRules(rules)
	log.Info("rules loaded", "path", f.config, "files", len(rules.Files()), "domains", rules.Domains(), "rules", len(rules.All()), "store", store.name)
	return srv, log, store.cleanup, nil
}

// logger is the service's logger, as --log-level and --log-format say.
func (f *serveFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	switch f.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})), nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", f.logFormat)
	}
}

// serverOptions checks the flags that become server options (all but the
// timeout, which depends on the store) and returns those options.
func (f *serveFlags) serverOptions() ([]service.Option, error) {
	mode, err := enforce.ParseFailureMode(f.failureMode)
	if err != nil {
		return nil, fmt.Errorf("--failure-mode %q: want open or closed", f.failureMode)
	}
	flavor, err := headers.ParseFlavor(f.headers)
	if err != nil {
		return nil, fmt.Errorf("--headers %q: want draft, ratelimit, x-ratelimit, all or none", f.headers)
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %v: want a positive duration", f.timeout)
	}
	if f.logInterval < 0 {
		return nil, fmt.Errorf("--log-interval %v: want a duration of 0 or more", f.logInterval)
	}
	bounds, err := f.bounds.options()
	if err != nil {
		return nil, err
	}
	envoy, err := f.envoy.options()
	if err != nil {
		return nil, err
	}
	if err := f.rulesFiles.check(); err != nil {
		return nil, err
	}
	return append(append(bounds, envoy...), service.WithFailureMode(mode), service.WithDryRun(f.shadow),
		service.WithLogInterval(f.logInterval), service.WithHeaders(flavor), service.WithLoadOptions(f.rulesFiles.options()...)), nil
}

// serveStore is the store serve decides with, and what goes with it.
type serveStore struct {
	tollgate.Store
	conc    tollgate.ConcurrencyStore   // the slots of concurrency rules
	name    string                      // "memory" or "redis", for the log
	ping    func(context.Context) error // nil for the memory store
	cleanup func()                      // closes the Redis client
}

// store makes the store of target: the embedded memory store when there
// is no Redis URL, else a Redis store whose scripts are preloaded.
func (f *serveFlags) store(target redisTarget, log *slog.Logger) (serveStore, error) {
	if target.url == "" {
		return serveStore{Store: memorystore.New(), conc: memorystore.NewConcurrency(), name: "memory", cleanup: func() {}}, nil
	}
	// go-redis logs through the service's logger, sampled and redacted,
	// from its first connection on.
	redis.SetLogger(newRedisLogger(log, target.redact, f.logInterval))
	if target.fromArgv {
		log.Warn("the --redis URL holds a password, which every local user can read in the process list; use --redis-password-file or $REDIS_AUTH")
	}
	client, err := service.NewRedisClient(target.url, target.options()...)
	if err != nil {
		return serveStore{}, err
	}
	// --redis-pipeline 0 turns pipelining off, on every kind of client.
	rs := redisstore.New(client, redisstore.WithPipeline(f.pipeline, 64), redisstore.WithPrefix(f.redisPrefix))
	store := f.extra.withLocalCache(rs, log)
	// Preload the scripts; if Redis is not there yet, the first decisions
	// load them.
	lctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err = rs.Load(lctx)
	if err == nil {
		err = rs.LoadConcurrency(lctx)
	}
	if err != nil {
		log.Warn("redis not reachable at startup; serving by failure mode until it is", "error", target.redact.Redact(err.Error()))
	}
	cancel()
	return serveStore{
		Store:   store,
		conc:    rs,
		name:    "redis",
		ping:    func(ctx context.Context) error { return client.Ping(ctx).Err() },
		cleanup: func() { client.Close() },
	}, nil
}

// background starts what keeps a server current until ctx ends: the store
// probe, the file watch and SIGHUP reloads.
func (f *serveFlags) background(ctx context.Context, srv *service.Server, log *slog.Logger) {
	go srv.Probe(ctx, time.Second)
	if f.watch {
		go func() {
			if err := config.Watch(ctx, f.config, 0, func() { srv.Reload(f.config) }); err != nil {
				log.Error("cannot watch the rules; reload with SIGHUP", "error", err.Error())
			}
		}()
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Info("SIGHUP: reloading rules", "path", f.config)
				srv.Reload(f.config)
			}
		}
	}()
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
	tls                           tlsFlags // tls.go
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
	hl, gl, err := o.listen()
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	}
	hl = tlsOn.httpListener(hl)
	// The stream workers are set in connFlags.grpcOptions.
	gopts := append(append(append(o.conns.grpcOptions(), srv.GRPCServerOptions()...), tr.grpcOptions()...), tlsOn.grpcOptions()...)
	g := grpc.NewServer(gopts...)
	srv.RegisterGRPC(g)
	hs := o.conns.httpServer(tr.handler(mux), log)

	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	o.f.background(bg, srv, log)

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
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate serve --config PATH [--redis URL] [flags]")
		fmt.Fprintln(stderr, "\nA drop-in for envoyproxy/ratelimit: the same gRPC protocol and rules files.")
		fs.PrintDefaults()
	}
	if _, err := applyEnvoyEnv(fs, getenv); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: envoyproxy/ratelimit's environment (see docs/envoy-environment.md): %v\n", err)
		return nil, 2, false
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0, false
		}
		return nil, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tollgate serve: unexpected argument %q\n", fs.Arg(0))
		return nil, 2, false
	}
	if err := o.f.extra.check(); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return nil, 2, false
	}
	if err := errors.Join(o.conns.check(true, o.debugAddr != ""), o.tls.check()); err != nil {
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

// mux is serve's HTTP handler: srv's endpoints and /auth, which builds
// descriptors from the original request as the flags say.
func (o *serveOptions) mux(srv *service.Server) (*http.ServeMux, error) {
	rules, err := o.f.httpRules()
	if err != nil {
		return nil, err
	}
	rules.URIHeader, rules.MethodHeader = o.f.bounds.uriHeader, o.f.bounds.methodHeader
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
// --drain-timeout; it returns hs's error when some were cut.
func (o *serveOptions) drain(g *grpc.Server, hs *http.Server) error {
	dctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	httpErr := hs.Shutdown(dctx)
	select {
	case <-stopped:
	case <-dctx.Done():
		g.Stop()
	}
	return httpErr
}

// rulesFileFlags say how the rules files are read, for directories laid
// out as envoyproxy/ratelimit's runtime reads them.
type rulesFileFlags struct {
	merge, tree, ignoreDot bool
	limits                 config.Limits
}

func (r *rulesFileFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&r.merge, "merge-domains", false, "merge the descriptors of one domain defined in several files (envoy's MERGE_DOMAIN_CONFIG), instead of refusing the second")
	fs.BoolVar(&r.tree, "runtime-tree", false, "read every file under --config, in every directory, as envoyproxy/ratelimit's runtime does, instead of the *.yaml and *.yml files in it")
	fs.BoolVar(&r.ignoreDot, "ignore-dotfiles", true, "with --runtime-tree, skip files and directories whose names start with '.' (envoy's RUNTIME_IGNOREDOTFILES; envoy reads them by default)")
	d := config.DefaultLimits()
	fs.Int64Var(&r.limits.MaxFileSize, "rules-max-file-bytes", d.MaxFileSize, "largest rules file; a larger one is refused")
	fs.Int64Var(&r.limits.MaxTotalSize, "rules-max-total-bytes", d.MaxTotalSize, "largest sum of the rules files")
	fs.IntVar(&r.limits.MaxFiles, "rules-max-files", d.MaxFiles, "most rules files (and, with --runtime-tree, directories)")
	fs.IntVar(&r.limits.MaxDescriptors, "rules-max-descriptors", d.MaxDescriptors, "most descriptors all the rules files together may define")
}

func (r *rulesFileFlags) check() error {
	l := r.limits
	for _, v := range []struct {
		name string
		n    int64
	}{{"--rules-max-file-bytes", l.MaxFileSize}, {"--rules-max-total-bytes", l.MaxTotalSize}, {"--rules-max-files", int64(l.MaxFiles)}, {"--rules-max-descriptors", int64(l.MaxDescriptors)}} {
		if v.n <= 0 {
			return fmt.Errorf("%s %d: want a positive number", v.name, v.n)
		}
	}
	return nil
}

func (r *rulesFileFlags) options() []config.Option {
	opts := []config.Option{config.WithLimits(r.limits)}
	if r.merge {
		opts = append(opts, config.WithMergeDomains())
	}
	if r.tree {
		opts = append(opts, config.WithRuntimeTree())
		if !r.ignoreDot {
			opts = append(opts, config.WithDotFiles())
		}
	}
	return opts
}

// envoyFlags are envoyproxy/ratelimit's behaviours the service can take
// on (see docs/migrating.md).
type envoyFlags struct {
	compat                     string
	nearLimit                  float64
	quota, metadata            bool
	limitH, remainingH, resetH string
}

func (e *envoyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.compat, "compat", "", "envoy: answer exactly as envoyproxy/ratelimit where tollgate differs on purpose (limit_remaining 0 over the limit, denied hits counted, no Retry-After)")
	fs.Float64Var(&e.nearLimit, "near-limit-ratio", service.DefaultNearLimitRatio, "share of a limit past which hits count as near_limit in ratelimit_service_rate_limit_near_limit (envoy's NEAR_LIMIT_RATIO)")
	fs.BoolVar(&e.quota, "quota-mode", false, "every rule is a quota rule: a request is over the limit only when all the quota rules it touches are (envoy's QUOTA_MODE)")
	fs.BoolVar(&e.metadata, "response-dynamic-metadata", false, "add the request's domain, descriptors and hits to every gRPC answer as dynamic metadata (envoy's RESPONSE_DYNAMIC_METADATA; it carries descriptor values)")
	fs.StringVar(&e.limitH, "header-limit", "", "name of the RateLimit-Limit field of --headers ratelimit (envoy's LIMIT_LIMIT_HEADER)")
	fs.StringVar(&e.remainingH, "header-remaining", "", "name of the RateLimit-Remaining field (envoy's LIMIT_REMAINING_HEADER)")
	fs.StringVar(&e.resetH, "header-reset", "", "name of the RateLimit-Reset field (envoy's LIMIT_RESET_HEADER)")
}

func (e *envoyFlags) options() ([]service.Option, error) {
	switch e.compat {
	case "", "envoy":
	default:
		return nil, fmt.Errorf("--compat %q: want envoy, or nothing", e.compat)
	}
	if !(e.nearLimit > 0 && e.nearLimit <= 1) {
		return nil, fmt.Errorf("--near-limit-ratio %v: want 0 < ratio ≤ 1", e.nearLimit)
	}
	return []service.Option{service.WithEnvoyCompat(e.compat == "envoy"), service.WithNearLimitRatio(e.nearLimit),
		service.WithQuotaMode(e.quota), service.WithResponseMetadata(e.metadata),
		service.WithHeaderNames(e.limitH, e.remainingH, e.resetH)}, nil
}
