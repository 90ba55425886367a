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
	"runtime"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/server"
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
}

// requestBounds are the flags bounding one request to the decision service
// and naming the auth endpoint's headers (see docs/operations.md,
// Hardening).
type requestBounds struct {
	descriptors, entries, hits, bytes int
	uriHeader, methodHeader           string
}

func (b *requestBounds) register(fs *flag.FlagSet) {
	fs.IntVar(&b.descriptors, "max-descriptors", server.DefaultMaxDescriptors, "most descriptors in one request; more is invalid (gRPC InvalidArgument, HTTP 400)")
	fs.IntVar(&b.entries, "max-entries", server.DefaultMaxEntries, "most entries in one descriptor; more is invalid")
	fs.IntVar(&b.hits, "max-hits", server.DefaultMaxHits, "largest hits_addend a caller may send; more is invalid (a sliding_window_log rule writes one entry per hit)")
	fs.IntVar(&b.bytes, "max-request-bytes", server.DefaultMaxRequestBytes, "largest gRPC message or /json body; more is refused (ResourceExhausted, HTTP 413)")
}

// registerAuth registers the flags naming the headers the auth endpoint
// reads the original request from.
func (b *requestBounds) registerAuth(fs *flag.FlagSet) {
	fs.StringVar(&b.uriHeader, "auth-uri-header", server.DefaultURIHeader, "/auth: the header the proxy passes the original request's URI in, and the only one read (X-Forwarded-Uri behind Traefik or Caddy)")
	fs.StringVar(&b.methodHeader, "auth-method-header", server.DefaultMethodHeader, "/auth: the header the proxy passes the original request's method in, and the only one read (X-Forwarded-Method behind Traefik or Caddy)")
}

func (b *requestBounds) options() ([]server.Option, error) {
	for _, v := range []struct {
		name string
		n    int
	}{{"--max-descriptors", b.descriptors}, {"--max-entries", b.entries}, {"--max-hits", b.hits}, {"--max-request-bytes", b.bytes}} {
		if v.n <= 0 {
			return nil, fmt.Errorf("%s %d: want a positive number", v.name, v.n)
		}
	}
	return []server.Option{server.WithMaxDescriptors(b.descriptors), server.WithMaxEntries(b.entries),
		server.WithMaxHits(b.hits), server.WithMaxRequestBytes(b.bytes)}, nil
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

// httpRules builds the server.HTTPRules of the flags.
func (f *serveFlags) httpRules() (server.HTTPRules, error) {
	var opts []clientip.Option
	if f.trusted != "" {
		opts = append(opts, clientip.TrustProxies(strings.Split(f.trusted, ",")...))
	}
	opts = append(opts, clientip.FromHeader(f.ipHeader))
	ip, err := clientip.New(opts...)
	if err != nil {
		return server.HTTPRules{}, fmt.Errorf("--trusted-proxies/--client-ip-header: %w", err)
	}
	for _, d := range f.descriptors {
		if err := server.ParseDescriptorSpec(d); err != nil {
			return server.HTTPRules{}, fmt.Errorf("--descriptor: %w", err)
		}
	}
	return server.HTTPRules{Domain: f.domain, Descriptors: f.descriptors, ClientIP: ip}, nil
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
	fs.StringVar(&f.headers, "headers", "draft", "rate-limit header fields in answers: draft (IETF RateLimit-Policy and RateLimit), ratelimit (RateLimit-Limit/-Remaining/-Reset), x-ratelimit, a comma-separated mix, all or none; Retry-After comes with every one")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.logInterval, "log-interval", enforce.DefaultLogInterval, "log store failures and the Redis client's own lines at most once per this long, each line saying how many were left out (similar_events_not_logged); 0 logs every one")
	f.bounds.register(fs)
}

// setup builds the logger, the store and the server from the flags, loads
// the rules, and returns a cleanup function.
func (f *serveFlags) setup(getenv env, stderr io.Writer) (*server.Server, *slog.Logger, func(), error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, nil, nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	var h slog.Handler
	switch f.logFormat {
	case "text":
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	case "json":
		h = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})
	default:
		return nil, nil, nil, fmt.Errorf("--log-format %q: want text or json", f.logFormat)
	}
	log := slog.New(h)
	if f.config == "" {
		return nil, nil, nil, errors.New("--config is required: a rules file or directory (see examples/ratelimit.yaml)")
	}
	mode, err := enforce.ParseFailureMode(f.failureMode)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--failure-mode %q: want open or closed", f.failureMode)
	}
	flavor, err := headers.ParseFlavor(f.headers)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--headers %q: want draft, ratelimit, x-ratelimit, all or none", f.headers)
	}
	if f.timeout <= 0 {
		return nil, nil, nil, fmt.Errorf("--timeout %v: want a positive duration", f.timeout)
	}
	if f.logInterval < 0 {
		return nil, nil, nil, fmt.Errorf("--log-interval %v: want a duration of 0 or more", f.logInterval)
	}
	bounds, err := f.bounds.options()
	if err != nil {
		return nil, nil, nil, err
	}
	rules, err := config.Load(f.config)
	if err != nil {
		return nil, nil, nil, err
	}
	target, err := resolveRedis(f.redis, f.redisPwFile, getenv)
	if err != nil {
		return nil, nil, nil, err
	}
	tuneGC(getenv, target.url == "", log)

	var store tollgate.Store
	var ping func(context.Context) error
	cleanup := func() {}
	storeName := "memory"
	if target.url == "" {
		store = memorystore.New()
	} else {
		// go-redis logs through the service's logger, sampled and
		// redacted, from its first connection on.
		redis.SetLogger(newRedisLogger(log, target.redact, f.logInterval))
		if target.fromArgv {
			log.Warn("the --redis URL holds a password, which every local user can read in the process list; use --redis-password-file or $REDIS_AUTH")
		}
		client, err := server.NewRedisClient(target.url, target.options()...)
		if err != nil {
			return nil, nil, nil, err
		}
		var ropts []redisstore.Option
		if f.pipeline > 0 {
			ropts = append(ropts, redisstore.WithPipeline(f.pipeline, 64))
		}
		rs := redisstore.New(client, append(ropts, redisstore.WithPrefix(f.redisPrefix))...)
		store, storeName = rs, "redis"
		ping = func(ctx context.Context) error { return client.Ping(ctx).Err() }
		cleanup = func() { client.Close() }
		// Preload the scripts; if Redis is not there yet, the first
		// decisions load them.
		lctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := rs.Load(lctx); err != nil {
			log.Warn("redis not reachable at startup; serving by failure mode until it is", "error", target.redact.Redact(err.Error()))
		}
		cancel()
	}
	timeout := f.timeout
	if target.url == "" {
		// The memory store never waits on I/O (a decision takes a
		// microsecond), so a deadline would only cost a timer per request.
		timeout = 0
	}
	srv, err := server.New(store, append(bounds,
		server.WithTimeout(timeout), server.WithFailureMode(mode), server.WithShadowMode(f.shadow),
		server.WithLogger(log), server.WithLogInterval(f.logInterval), server.WithPing(ping), server.WithHeaders(flavor))...)
	if err != nil {
		cleanup()
		return nil, nil, nil, err
	}
	srv.SetRules(rules)
	log.Info("rules loaded", "path", f.config, "files", len(rules.Files()), "domains", rules.Domains(), "rules", len(rules.All()), "store", storeName)
	return srv, log, cleanup, nil
}

// background starts what keeps a server current until ctx ends: the store
// probe, the file watch and SIGHUP reloads.
func (f *serveFlags) background(ctx context.Context, srv *server.Server, log *slog.Logger) {
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

func runServe(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tollgate serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	f.registerHTTP(fs, "127.0.0.0/8,::1/128")
	f.bounds.registerAuth(fs)
	httpAddr := fs.String("http", "", "HTTP address for /json, /auth, /healthcheck, /readyz, /metrics (default 127.0.0.1:8080; :8080 with --listen-all)")
	grpcAddr := fs.String("grpc", "", "gRPC address for envoy.service.ratelimit.v3.RateLimitService (default 127.0.0.1:8081; :8081 with --listen-all)")
	listenAll := fs.Bool("listen-all", false, "listen on every interface for the default addresses, not only on loopback")
	drainTimeout := fs.Duration("drain-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long requests in flight may take to finish")
	debugAddr := fs.String("debug", "", "address for /debug/pprof (off by default; keep it on loopback)")
	shutdownDelay := fs.Duration("shutdown-delay", 0, "on SIGTERM or SIGINT, how long to keep serving with /readyz failing before closing the listeners (for load balancers to notice)")
	var conns connFlags
	conns.registerHTTP(fs, 30*time.Second)
	conns.registerGRPC(fs)
	conns.registerDebug(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate serve --config PATH [--redis URL] [flags]")
		fmt.Fprintln(stderr, "\nA drop-in for envoyproxy/ratelimit: the same gRPC protocol and rules files.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tollgate serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := conns.check(true, *debugAddr != ""); err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 2
	}
	host := "127.0.0.1"
	if *listenAll {
		host = ""
	}
	if *httpAddr == "" {
		*httpAddr = net.JoinHostPort(host, "8080")
	}
	if *grpcAddr == "" {
		*grpcAddr = net.JoinHostPort(host, "8081")
	}
	srv, log, cleanup, err := f.setup(getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		if strings.HasPrefix(err.Error(), "--") {
			return 2
		}
		return 1
	}
	defer cleanup()

	rules, err := f.httpRules()
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 2
	}
	rules.URIHeader, rules.MethodHeader = f.bounds.uriHeader, f.bounds.methodHeader
	auth, err := srv.AuthHandler(rules)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 2
	}
	hl, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	}
	gl, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		hl.Close()
		fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.Handle("/", srv.Handler())
	mux.Handle("/auth", auth)
	// Stream workers reuse goroutines whose stacks have grown, instead of
	// growing a fresh one for every request.
	g := grpc.NewServer(append(append(conns.grpcOptions(), srv.GRPCServerOptions()...), grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))))...)
	srv.RegisterGRPC(g)
	hs := conns.httpServer(mux, log)

	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	f.background(bg, srv, log)

	errc := make(chan error, 2)
	go func() { errc <- g.Serve(gl) }()
	go func() { errc <- hs.Serve(hl) }()
	if *debugAddr != "" {
		dl, err := net.Listen("tcp", *debugAddr)
		if err != nil {
			fmt.Fprintf(stderr, "tollgate serve: %v\n", err)
			return 1
		}
		dmux := http.NewServeMux()
		dmux.HandleFunc("/debug/pprof/", pprof.Index)
		dmux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		dmux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		ds := conns.debugServer(dmux, log)
		go ds.Serve(dl)
		defer ds.Close()
		log.Info("debug listening", "addr", dl.Addr().String())
	}
	log.Info("listening", "http", hl.Addr().String(), "grpc", gl.Addr().String())

	select {
	case <-ctx.Done():
		// Not ready first, then say so: whoever reads the log line (an
		// operator, a test) finds /readyz already failing.
		srv.Drain()
		log.Info("shutting down: draining requests in flight", "shutdown_delay", shutdownDelay.String(), "drain_timeout", drainTimeout.String())
	case err := <-errc:
		srv.Drain()
		log.Error("a listener failed; shutting down", "error", err.Error())
	}
	if *shutdownDelay > 0 {
		time.Sleep(*shutdownDelay)
	}
	dctx, cancel := context.WithTimeout(context.Background(), *drainTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	httpErr := hs.Shutdown(dctx)
	select {
	case <-stopped:
	case <-dctx.Done():
		g.Stop()
	}
	stopBG()
	if httpErr != nil {
		log.Warn("HTTP requests still in flight at the drain timeout were cut", "error", httpErr.Error())
	}
	log.Info("stopped")
	return 0
}
