package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/config"
)

// serveFlags are the flags serve and proxy share.
type serveFlags struct {
	config      string
	redis       string
	redisPwFile string
	redisPrefix string
	pipeline    time.Duration
	timeout     time.Duration
	failureMode string
	failRetry   time.Duration
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
	// rules over xDS instead of --config (serve only; xdsflags.go)
	xds xdsFlags
}

// requestBounds are the flags bounding one request to the decision service
// and naming the auth endpoint's headers (see docs/operations.md,
// Hardening).
type requestBounds struct {
	descriptors, entries, hits, bytes int
	authProxy                         authProxy
	metricNames, metricNameBytes      int
	uriHeader, methodHeader           string
}

func (b *requestBounds) register(fs *flag.FlagSet) {
	fs.IntVar(&b.descriptors, "max-descriptors", service.DefaultMaxDescriptors, "most descriptors in one request; more is invalid (gRPC InvalidArgument, HTTP 400)")
	fs.IntVar(&b.entries, "max-entries", service.DefaultMaxEntries, "most entries in one descriptor; more is invalid")
	fs.IntVar(&b.hits, "max-hits", service.DefaultMaxHits, "largest hits_addend a caller may send; more is invalid (a sliding_window_log rule writes one entry per hit)")
	fs.IntVar(&b.bytes, "max-request-bytes", service.DefaultMaxRequestBytes, "largest gRPC message or /json body; more is refused (ResourceExhausted, HTTP 413)")
	fs.IntVar(&b.metricNames, "max-metric-names", service.DefaultMaxMetricNames, "most statistics names taken from requests (detailed_metric, value_to_metric, a descriptor's own limit) with series of their own; later new ones are counted under <domain>."+service.OverflowName)
	fs.IntVar(&b.metricNameBytes, "max-metric-name-bytes", service.DefaultMaxMetricNameBytes, "longest statistics name taken from a request with series of its own; longer ones are counted under <domain>."+service.OverflowName)
}

// registerAuth registers the flags naming the headers the auth endpoint
// reads the original request from.
func (b *requestBounds) registerAuth(fs *flag.FlagSet) {
	b.authProxy = "nginx"
	fs.Var(&b.authProxy, "auth-proxy", "/auth: the `proxy` in front, which says the headers the original request is read from: nginx (auth_request: X-Original-URI and X-Original-Method), caddy (forward_auth) or traefik (ForwardAuth), both X-Forwarded-Uri and X-Forwarded-Method")
	fs.StringVar(&b.uriHeader, "auth-uri-header", "", "/auth: the header the proxy passes the original request's URI in, and the only one read, for a proxy --auth-proxy does not name (default: --auth-proxy's)")
	fs.StringVar(&b.methodHeader, "auth-method-header", "", "/auth: the header the proxy passes the original request's method in, and the only one read (default: --auth-proxy's)")
}

// authProxy is the --auth-proxy flag: a proxy in authProxies.
type authProxy string

// authProxies are the headers each proxy passes the original request to
// /auth in: nginx's as examples/nginx sets them, and those Caddy's
// forward_auth and Traefik's ForwardAuth set on every request, replacing
// the client's.
var authProxies = map[authProxy][2]string{
	"nginx":   {service.DefaultURIHeader, service.DefaultMethodHeader},
	"caddy":   {"X-Forwarded-Uri", "X-Forwarded-Method"},
	"traefik": {"X-Forwarded-Uri", "X-Forwarded-Method"},
}

func (p *authProxy) String() string { return string(*p) }

func (p *authProxy) Set(v string) error {
	if _, ok := authProxies[authProxy(v)]; !ok {
		return errors.New("want nginx, caddy or traefik")
	}
	*p = authProxy(v)
	return nil
}

// authHeaders returns the headers /auth reads the original request from,
// and what its 400 says when they are missing: the flag that names them.
func (b *requestBounds) authHeaders() (uri, method, help string) {
	h := authProxies[b.authProxy]
	uri, method = h[0], h[1]
	help = fmt.Sprintf("tollgate serve reads the headers of --auth-proxy %s; name the proxy in front with --auth-proxy caddy, --auth-proxy traefik or --auth-proxy nginx", b.authProxy)
	if b.uriHeader != "" || b.methodHeader != "" {
		help = "tollgate serve's --auth-uri-header and --auth-method-header name them"
	}
	if b.uriHeader != "" {
		uri = b.uriHeader
	}
	if b.methodHeader != "" {
		method = b.methodHeader
	}
	return uri, method, help
}

func (b *requestBounds) options() ([]service.Option, error) {
	for _, v := range []struct {
		name string
		n    int
	}{{"--max-descriptors", b.descriptors}, {"--max-entries", b.entries}, {"--max-hits", b.hits}, {"--max-request-bytes", b.bytes},
		{"--max-metric-names", b.metricNames}, {"--max-metric-name-bytes", b.metricNameBytes}} {
		if v.n <= 0 {
			return nil, fmt.Errorf("%s %d: want a positive number", v.name, v.n)
		}
	}
	return []service.Option{service.WithMaxDescriptors(b.descriptors), service.WithMaxEntries(b.entries),
		service.WithMaxHits(b.hits), service.WithMaxRequestBytes(b.bytes),
		service.WithMaxMetricNames(b.metricNames), service.WithMaxMetricNameBytes(b.metricNameBytes)}, nil
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
	// The window only bounds how long decisions gathered behind a round
	// trip in flight wait for it to return: under load each pipeline
	// carries what came during the last one. A window shorter than a
	// round trip sends the batch early, from a goroutine of its own, as a
	// second pipeline in flight beside the first: 50 µs took the service
	// about a seventh more CPU a decision than 1 ms (redisstore's own
	// default), with no lower p99.
	fs.DurationVar(&f.pipeline, "redis-pipeline", time.Millisecond, "send concurrent decisions to Redis in pipelines: one made while none is in flight goes at once, those made meanwhile go together when it returns, after at most this long (or at 64), each bounded by --timeout; 0 sends each alone")
	fs.DurationVar(&f.timeout, "timeout", enforce.DefaultTimeout, "deadline of a request's store calls; past it, each rule's failure mode answers")
	fs.StringVar(&f.failureMode, "failure-mode", "open", "what rules without failure_mode answer when the store fails: open (OK) or closed (OVER_LIMIT)")
	fs.DurationVar(&f.failRetry, "fail-closed-retry-after", service.DefaultFailClosedRetryAfter, "Retry-After (and duration_until_reset) of an answer over the limit because a rule failed closed: when to come back, unless a denial waits longer")
	fs.BoolVar(&f.shadow, "shadow-mode", false, "global shadow mode: decide and count, but always answer OK")
	fs.BoolVar(&f.watch, "watch", true, "reload the rules when their files change (SIGHUP always reloads)")
	f.rulesFiles.register(fs)
	f.envoy.register(fs)
	fs.StringVar(&f.headers, "headers", "draft", "rate-limit header fields in answers: draft (IETF RateLimit-Policy and RateLimit), ratelimit (RateLimit-Limit/-Remaining/-Reset), x-ratelimit, a comma-separated mix, all or none; Retry-After comes with every one")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.logInterval, "log-interval", enforce.DefaultLogInterval, "log store failures, each kind of descriptor no rule matches, and the Redis client's own lines at most once per this long, each line saying how many were left out (similar_events_not_logged); 0 logs every one")
	f.bounds.register(fs)
	f.redisTLS.register(fs)
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
	fs.IntVar(&r.limits.MaxDescriptors, "rules-max-descriptors", d.MaxDescriptors, "most descriptors all the rules files together may define (each limit of a rate_limits list counts as one)")
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
	fs.BoolVar(&e.metadata, "response-dynamic-metadata", false, "add the request's domain, descriptors and hits, and the rules' metadata of the descriptors answered OK, merged, to every answer (gRPC and /json) as dynamic metadata (envoy's RESPONSE_DYNAMIC_METADATA; it carries descriptor values)")
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
