package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// tollgate serve reads envoyproxy/ratelimit's environment, so that a
// Deployment of that service keeps working when only its image changes.
// envoyproxy/ratelimit is configured by its environment alone; tollgate by
// flags. Before the flags are parsed, every variable of envoy's that is set
// becomes the value of a flag (so a flag on the command line still wins),
// is accepted because envoy's behaviour there is tollgate's anyway, or
// stops the start because it asks for something tollgate does not do. The
// table envoyVars says which, for every variable envoy reads; a variable
// missing from it would be ignored without a word, which this file exists
// to prevent. docs/envoy-environment.md is the same table for users.

// envoyKind is what tollgate serve does with one of envoy's variables.
type envoyKind int

const (
	// envoyHonoured: the variable becomes (part of) a flag's value.
	envoyHonoured envoyKind = iota
	// envoySame: tollgate behaves as envoy does with this variable's
	// accepted values, without a flag.
	envoySame
	// envoyRefused: the variable asks for something tollgate does not do;
	// only the value that asks for nothing (envoy's default, or off) is
	// accepted.
	envoyRefused
)

// envoyVar is one variable of envoyproxy/ratelimit's environment.
type envoyVar struct {
	name string
	def  string // envoy's default
	kind envoyKind
	// flag is the flag an honoured variable sets.
	flag string
	// on, when not nil, says whether the variable matters at all: envoy
	// reads STATSD_HOST only with statsd on, MEMCACHE_* only with the
	// memcache backend, and so on. While it is off, the variable is
	// accepted and unused, by envoy and by tollgate alike.
	on func(e envoyEnv) bool
	// check refuses the values of an envoySame variable that tollgate
	// does not behave like (nil: every value is accepted).
	check func(v string) error
	// off is the value of a refused variable that asks for nothing, when
	// it is not envoy's default (USE_STATSD=false).
	off string
	// note says what tollgate does with the variable, or for a refused
	// one what to use instead; refusals quote it.
	note string
	// secret: the variable can carry a credential (a password, a token
	// in a header, user information in a URL, free-form metadata, a
	// private key or its path), so no message ever shows its value (see
	// envoySetting).
	secret bool
}

// envoyVars is every variable envoyproxy/ratelimit reads (its
// src/settings/settings.go), and OTEL_EXPORTER_OTLP_ENDPOINT, which its
// tracing reads through OpenTelemetry.
var envoyVars = []envoyVar{
	// Listeners.
	{name: "HOST", def: "0.0.0.0", flag: "http", note: "--http HOST:PORT: /json, /healthcheck, /metrics, /auth"},
	{name: "PORT", def: "8080", flag: "http", note: "--http HOST:PORT"},
	{name: "GRPC_HOST", def: "0.0.0.0", flag: "grpc", note: "--grpc GRPC_HOST:GRPC_PORT"},
	{name: "GRPC_PORT", def: "8081", flag: "grpc", note: "--grpc GRPC_HOST:GRPC_PORT"},
	{name: "DEBUG_HOST", def: "0.0.0.0", flag: "debug", note: "--debug DEBUG_HOST:DEBUG_PORT: /debug/pprof"},
	{name: "DEBUG_PORT", def: "6070", flag: "debug", note: "--debug DEBUG_HOST:DEBUG_PORT"},
	{name: "GRPC_UDS", kind: envoyRefused, note: "tollgate serves gRPC on TCP only: use GRPC_HOST and GRPC_PORT (or --grpc)"},
	{name: "GRPC_MAX_CONNECTION_AGE", def: "24h", kind: envoyRefused, note: "tollgate sets no age limit on gRPC connections; it closes idle ones (--grpc-max-connection-idle, default 5m): remove the variable"},
	{name: "GRPC_MAX_CONNECTION_AGE_GRACE", def: "1h", kind: envoyRefused, note: "tollgate sets no age limit on gRPC connections (see GRPC_MAX_CONNECTION_AGE): remove the variable"},
	{name: "GRPC_SERVER_USE_TLS", def: "false", flag: "grpc-tls-cert", note: "true: the gRPC listener speaks TLS with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"},
	{name: "GRPC_SERVER_TLS_CERT", flag: "grpc-tls-cert", on: grpcTLSOn, note: "--grpc-tls-cert, with GRPC_SERVER_USE_TLS=true"},
	{name: "GRPC_SERVER_TLS_KEY", secret: true, flag: "grpc-tls-key", on: grpcTLSOn, note: "--grpc-tls-key, with GRPC_SERVER_USE_TLS=true"},
	{name: "GRPC_CLIENT_TLS_CACERT", flag: "grpc-tls-client-ca", on: grpcTLSOn, note: "--grpc-tls-client-ca (clients must show a certificate), with GRPC_SERVER_USE_TLS=true"},
	{name: "GRPC_CLIENT_TLS_SAN", flag: "grpc-tls-client-san", on: grpcTLSOn, note: "--grpc-tls-client-san, with GRPC_SERVER_USE_TLS=true"},

	// Logs.
	{name: "LOG_LEVEL", def: "WARN", flag: "log-level", note: "--log-level: trace and debug are debug, warning is warn, fatal and panic are error; unset, tollgate's info (a few lines at start and stop)"},
	{name: "LOG_FORMAT", def: "text", flag: "log-format", note: "--log-format: json is json, anything else text"},

	// Where the rules come from.
	{name: "CONFIG_TYPE", def: "FILE", flag: "xds", note: "FILE: the rules come from RUNTIME_ROOT (--config); GRPC_XDS_SOTW: from the xDS management server at CONFIG_GRPC_XDS_SERVER_URL (--xds); anything else is refused, as envoy refuses it"},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", def: "false", flag: "xds-force-start", on: xdsOn, note: "--xds-force-start: true serves before the first rules have come (/healthcheck 200, requests fail with gRPC Unknown \"no rate limit configuration loaded\"); false listens once the first response is handled"},
	{name: "CONFIG_GRPC_XDS_NODE_ID", def: "default", flag: "xds-node-id", on: xdsOn, note: "--xds-node-id"},
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", secret: true, flag: "xds-node-metadata", on: xdsOn, note: "--xds-node-metadata: key=value,key=value, string values; an entry without = is left out, as envoy leaves it out, and logged"},
	{name: "CONFIG_GRPC_XDS_SERVER_URL", secret: true, def: "localhost:18000", flag: "xds", on: xdsOn, note: "--xds: the management server, host:port"},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", def: "3s", kind: envoySame, check: checkDuration, on: xdsOn, note: "envoy gives it to a retry of gRPC calls that leaves streams alone, so its xDS stream does not use it either: reconnections follow XDS_CLIENT_BACKOFF_*"},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", secret: true, kind: envoySame, on: xdsOn, note: "name:value,name:value, sent with the xDS stream; read from the environment in and out of envoy mode, never a flag, and never logged (a credential)"},
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", def: "false", flag: "xds-tls", on: xdsOn, note: "--xds-tls"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", flag: "xds-tls-cert", on: xdsTLSOn, note: "--xds-tls-cert, with CONFIG_GRPC_XDS_SERVER_USE_TLS=true"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", secret: true, flag: "xds-tls-key", on: xdsTLSOn, note: "--xds-tls-key, with CONFIG_GRPC_XDS_SERVER_USE_TLS=true"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", flag: "xds-tls-ca", on: xdsTLSOn, note: "--xds-tls-ca, with CONFIG_GRPC_XDS_SERVER_USE_TLS=true: the server's certificate must chain to it (envoy also trusts the system's roots beside it)"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", flag: "xds-tls-server-name", on: xdsTLSOn, note: "--xds-tls-server-name, with CONFIG_GRPC_XDS_SERVER_USE_TLS=true"},
	{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", def: "10s", flag: "xds-backoff-initial", on: xdsOn, note: "--xds-backoff-initial"},
	{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", def: "60s", flag: "xds-backoff-max", on: xdsOn, note: "--xds-backoff-max"},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", def: "0.5", flag: "xds-backoff-random-factor", on: xdsOn, note: "--xds-backoff-random-factor"},
	{name: "XDS_CLIENT_BACKOFF_JITTER", def: "true", flag: "xds-backoff-jitter", on: xdsOn, note: "--xds-backoff-jitter"},
	{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", flag: "xds-max-message-bytes", on: xdsOn, note: "--xds-max-message-bytes; unset, gRPC's 4 MiB"},
	{name: "RUNTIME_ROOT", def: "/srv/runtime_data/current", flag: "config", on: fileOn, note: "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY"},
	{name: "RUNTIME_SUBDIRECTORY", flag: "config", on: fileOn, note: "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY; unset while RUNTIME_WATCH_ROOT is true, envoy loads no rules at all, and tollgate wants --config"},
	{name: "RUNTIME_APPDIRECTORY", def: "config", flag: "config", on: fileOn, note: "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY"},
	{name: "RUNTIME_IGNOREDOTFILES", def: "false", flag: "ignore-dotfiles", on: fileOn, note: "--ignore-dotfiles: true skips files whose names start with a dot"},
	{name: "RUNTIME_WATCH_ROOT", def: "true", kind: envoySame, check: checkBool, on: fileOn, note: "true or false, the rules are reloaded when their files change, replaced or moved into place (--watch, on by default; SIGHUP reloads too)"},
	{name: "MERGE_DOMAIN_CONFIG", def: "false", flag: "merge-domains", note: "--merge-domains: files of one domain are merged"},

	// Statistics.
	{name: "USE_STATSD", def: "true", flag: "statsd", note: "true (the default): --statsd STATSD_HOST:STATSD_PORT, envoy's statistics named as envoy names them; not with USE_PROMETHEUS=true or USE_DOG_STATSD=true, which envoy refuses too"},
	{name: "STATSD_HOST", def: "localhost", flag: "statsd", on: statsdOn, note: "--statsd (or --dogstatsd) STATSD_HOST:STATSD_PORT"},
	{name: "STATSD_PORT", def: "8125", flag: "statsd", on: statsdOn, note: "--statsd (or --dogstatsd) STATSD_HOST:STATSD_PORT"},
	{name: "STATSD_PROTOCOL", def: "tcp", flag: "statsd-protocol", on: gostatsOn, note: "--statsd-protocol: tcp or udp (envoy's statsd library, lyft/gostats, reads it; DogStatsD is UDP whatever it says)"},
	{name: "GOSTATS_FLUSH_INTERVAL_SECONDS", def: "5", kind: envoySame, on: gostatsOn, check: checkInt, note: "read by lyft/gostats, whose interval envoy does not use: statistics are flushed every STATS_FLUSH_INTERVAL; a whole number"},
	{name: "GOSTATS_LOGGING_SINK_DISABLED", def: "false", kind: envoySame, on: gostatsOn, check: checkBool, note: "read by lyft/gostats, for a sink envoy does not use: true or false, unused"},
	{name: "USE_DOG_STATSD", def: "false", flag: "dogstatsd", note: "true: --dogstatsd STATSD_HOST:STATSD_PORT, envoy's statistics in DogStatsD's format over UDP, EXTRA_TAGS and DD_ENV, DD_SERVICE, DD_VERSION, DD_ENTITY_ID as its tags; with USE_STATSD=false, as envoy refuses the two together, and not with USE_PROMETHEUS=true"},
	{name: "USE_DOG_STATSD_MOGRIFIERS", flag: "dogstatsd-mogrifiers", on: dogStatsdOn, note: "--dogstatsd-mogrifiers: NAME,NAME, each read from DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS, as envoy reads them; the first whose pattern matches renames and tags a statistic; wrong variables stop the start"},
	{name: "EXTRA_TAGS", flag: "stats-tags", on: sinkOn, note: "--stats-tags: name:value,… as gostats tags (name.__tag=value) of the statsd or mapped statistics, DogStatsD's tags"},
	{name: "STATS_FLUSH_INTERVAL", def: "10s", flag: "stats-flush", on: sinkOn, note: "--stats-flush: how often statsd, DogStatsD or the mapping gets the counters that changed"},
	{name: "DISABLE_STATS", def: "false", kind: envoySame, check: checkBool, note: "true: no statsd, DogStatsD or mapped statistics, as envoy sends none; tollgate's own Prometheus metrics stay"},
	{name: "USE_PROMETHEUS", def: "false", flag: "prometheus-addr", note: "true: Prometheus metrics on a listener of their own, PROMETHEUS_ADDR and PROMETHEUS_PATH (also always on the HTTP listener's /metrics)"},
	{name: "PROMETHEUS_ADDR", def: ":9090", flag: "prometheus-addr", on: prometheusOn, note: "--prometheus-addr, with USE_PROMETHEUS=true"},
	{name: "PROMETHEUS_PATH", def: "/metrics", flag: "prometheus-path", on: prometheusOn, note: "--prometheus-path, with USE_PROMETHEUS=true"},
	{name: "PROMETHEUS_MAPPER_YAML", flag: "prometheus-mapper", on: prometheusOn, note: "--prometheus-mapper: envoy's statistics mapped by this statsd_exporter mapping in process, in place of tollgate's own ratelimit_service_rate_limit_*, with USE_PROMETHEUS=true"},
	{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", def: "false", kind: envoyRefused, on: defaultMapperOn, note: "tollgate's durations are in seconds, as Prometheus names them: remove the variable"},

	// Decisions and answers.
	{name: "BACKEND_TYPE", def: "redis", kind: envoyRefused, note: "tollgate's shared store is Redis: use BACKEND_TYPE=redis and REDIS_URL"},
	{name: "EXPIRATION_JITTER_MAX_SECONDS", def: "300", kind: envoySame, check: checkInt, note: "each key expires when its limit no longer needs it; expiry spreads with the traffic"},
	{name: "LOCAL_CACHE_SIZE_IN_BYTES", def: "0", flag: "local-cache-bytes", note: "--local-cache-bytes: keys over their limit are denied locally, without a Redis call, until they could pass"},
	{name: "NEAR_LIMIT_RATIO", def: "0.8", flag: "near-limit-ratio", note: "--near-limit-ratio (the near_limit statistic)"},
	{name: "CACHE_KEY_PREFIX", flag: "redis-prefix", note: "--redis-prefix; unset, tollgate's \"tollgate:\" (its keys are not envoy's keys in any case)"},
	{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", def: "false", kind: envoyRefused, note: "envoy mode counts denied hits as envoy's default does; to stop counting them run without it (--compat \"\"), which also reports what is left of a limit and adds Retry-After"},
	{name: "LIMIT_RESPONSE_HEADERS_ENABLED", def: "false", flag: "headers", note: "--headers ratelimit when true, else --headers none"},
	{name: "LIMIT_LIMIT_HEADER", def: "RateLimit-Limit", flag: "header-limit", note: "--header-limit"},
	{name: "LIMIT_REMAINING_HEADER", def: "RateLimit-Remaining", flag: "header-remaining", note: "--header-remaining"},
	{name: "LIMIT_RESET_HEADER", def: "RateLimit-Reset", flag: "header-reset", note: "--header-reset"},
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", def: "false", kind: envoyRefused, on: xdsOn, note: "with rules from files tollgate never serves without them, true or false; over xDS, /healthcheck answers 200 before the first rules, as envoy's with false, and /readyz fails until they come: probe /readyz rather than set true"},
	{name: "SHADOW_MODE", def: "false", flag: "shadow-mode", note: "--shadow-mode"},
	{name: "QUOTA_MODE", def: "false", flag: "quota-mode", note: "--quota-mode: every rule is a quota rule"},
	{name: "RESPONSE_DYNAMIC_METADATA", def: "false", flag: "response-dynamic-metadata", note: "--response-dynamic-metadata: the request's domain, descriptors and hits_addend, and under metadata the rules' metadata of the descriptors answered OK, merged as envoy merges it"},

	// Redis.
	{name: "REDIS_SOCKET_TYPE", def: "unix", flag: "redis", on: redisOn, note: "tcp; unix is refused: tollgate reaches Redis over TCP only"},
	{name: "REDIS_TYPE", def: "SINGLE", flag: "redis", on: redisOn, note: "SINGLE is redis://, SENTINEL redis+sentinel://, CLUSTER redis+cluster://"},
	{name: "REDIS_URL", secret: true, def: "/var/run/nutcracker/ratelimit.sock", flag: "redis", note: "--redis: host:port; master,sentinel:port,… for SENTINEL; host:port,host:port for CLUSTER; a redis:// URL is taken as it is. Unset, the memory store (one instance)"},
	{name: "REDIS_POOL_SIZE", def: "10", flag: "redis", on: redisOn, note: "the --redis URL's pool_size"},
	{name: "REDIS_AUTH", secret: true, flag: "redis", on: redisOn, note: "\"user:password\" or \"password\": the password is passed as $REDIS_AUTH is outside envoy mode, never in the URL; a user name goes into the --redis URL (with a redis:// REDIS_URL, put the user name in that URL)"},
	{name: "REDIS_SENTINEL_AUTH", secret: true, flag: "redis", on: redisOn, note: "the sentinels' own \"user:password\" or \"password\", in the --redis URL's user information (removed from every log line and error)"},
	{name: "REDIS_TLS", def: "false", flag: "redis", on: redisOn, note: "true: rediss:// (TLS)"},
	{name: "REDIS_TLS_CLIENT_CERT", flag: "redis-tls-cert", on: redisTLSOn, note: "--redis-tls-cert, with REDIS_TLS=true"},
	{name: "REDIS_TLS_CLIENT_KEY", secret: true, flag: "redis-tls-key", on: redisTLSOn, note: "--redis-tls-key, with REDIS_TLS=true"},
	{name: "REDIS_TLS_CACERT", flag: "redis-tls-ca", on: redisTLSOn, note: "--redis-tls-ca, with REDIS_TLS=true"},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", flag: "redis-tls-skip-verify-hostname", on: redisTLSOn, note: "--redis-tls-skip-verify-hostname, with REDIS_TLS=true"},
	{name: "REDIS_TIMEOUT", def: "10s", flag: "redis", on: redisOn, note: "the --redis URL's dial_timeout (envoy bounds connecting by it; each request's Redis calls are bounded by --timeout)"},
	{name: "REDIS_PIPELINE_WINDOW", def: "0", flag: "redis-pipeline", note: "--redis-pipeline; unset, tollgate's 1ms"},
	{name: "REDIS_PIPELINE_LIMIT", def: "0", kind: envoySame, check: checkInt, note: "unused by envoy too (deprecated); --redis-pipeline sends at most 64 decisions together"},
	{name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", def: "1", kind: envoySame, check: checkInt, note: "a Cluster client sends to its nodes in parallel, one pipeline per node"},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", def: "false", kind: envoySame, check: checkBool, note: "/readyz and the gRPC health service follow a Redis ping every second, true or false"},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", def: "WAIT", kind: envoySame, check: checkPoolWait, note: "WAIT: a request waits for a pooled connection (within its deadline); CREATE and ERROR make envoy panic and are refused"},
	{name: "REDIS_STARTUP_INITIAL_INTERVAL", def: "1s", kind: envoySame, check: checkDuration, note: "tollgate starts without waiting for Redis, answers by failure mode until it is reachable, and reconnects by itself"},
	{name: "REDIS_STARTUP_MAX_INTERVAL", def: "30s", kind: envoySame, check: checkDuration, note: "see REDIS_STARTUP_INITIAL_INTERVAL"},
	{name: "REDIS_STARTUP_MAX_ELAPSED_TIME", def: "0", kind: envoySame, check: checkDuration, note: "see REDIS_STARTUP_INITIAL_INTERVAL: tollgate never exits for want of Redis"},
	{name: "REDIS_PERSECOND", def: "false", kind: envoyRefused, note: "tollgate keeps every limit in one Redis: remove REDIS_PERSECOND and the REDIS_PERSECOND_* variables"},
	{name: "REDIS_PERSECOND_SOCKET_TYPE", def: "unix", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TYPE", def: "SINGLE", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_URL", secret: true, def: "/var/run/nutcracker/ratelimitpersecond.sock", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_POOL_SIZE", def: "10", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_AUTH", secret: true, kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TLS", def: "false", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_SENTINEL_AUTH", secret: true, kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_PIPELINE_WINDOW", def: "0", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_PIPELINE_LIMIT", def: "0", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", def: "1", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TIMEOUT", def: "10s", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", def: "WAIT", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},

	// Memcached.
	{name: "MEMCACHE_HOST_PORT", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_MAX_IDLE_CONNS", def: "2", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_SRV", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_SRV_REFRESH", def: "0", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_TLS", def: "false", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_TLS_CLIENT_CERT", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_TLS_CLIENT_KEY", secret: true, kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_TLS_CACERT", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},

	// Tracing.
	{name: "TRACING_ENABLED", def: "false", flag: "tracing", note: "--tracing"},
	{name: "TRACING_SERVICE_NAME", def: "RateLimit", flag: "tracing-service-name", on: tracingOn, note: "--tracing-service-name, envoy's default with TRACING_ENABLED=true"},
	{name: "TRACING_SERVICE_NAMESPACE", flag: "tracing-service-namespace", on: tracingOn, note: "--tracing-service-namespace"},
	{name: "TRACING_SERVICE_INSTANCE_ID", flag: "tracing-service-instance-id", on: tracingOn, note: "--tracing-service-instance-id"},
	{name: "TRACING_EXPORTER_PROTOCOL", def: "http", flag: "tracing-exporter-protocol", on: tracingOn, note: "--tracing-exporter-protocol, envoy's default with TRACING_ENABLED=true"},
	{name: "TRACING_SAMPLING_RATE", def: "1", flag: "tracing-sampling-rate", on: tracingOn, note: "--tracing-sampling-rate, envoy's default with TRACING_ENABLED=true"},
	{name: "OTEL_EXPORTER_OTLP_ENDPOINT", secret: true, kind: envoySame, on: tracingOn, note: "tollgate's tracing reads OpenTelemetry's OTEL_EXPORTER_OTLP_* variables as envoy's does, after --tracing-endpoint (it alone does not turn envoy mode on)"},
}

// The switches that say whether a group of variables matters (envoyVar.on).
func grpcTLSOn(e envoyEnv) bool { return e.isTrue("GRPC_SERVER_USE_TLS") }
func xdsOn(e envoyEnv) bool     { return strings.EqualFold(e.get("CONFIG_TYPE"), "GRPC_XDS_SOTW") }
func fileOn(e envoyEnv) bool    { return strings.EqualFold(e.get("CONFIG_TYPE"), "FILE") }
func xdsTLSOn(e envoyEnv) bool  { return xdsOn(e) && e.isTrue("CONFIG_GRPC_XDS_SERVER_USE_TLS") }
func statsdOn(e envoyEnv) bool {
	return !e.isTrue("DISABLE_STATS") && (e.isTrue("USE_STATSD") || e.isTrue("USE_DOG_STATSD"))
}

// gostatsOn: statsd through lyft/gostats' own sink, which reads
// STATSD_PROTOCOL and GOSTATS_*; DogStatsD has a sink of its own.
func gostatsOn(e envoyEnv) bool { return !e.isTrue("DISABLE_STATS") && e.isTrue("USE_STATSD") }
func sinkOn(e envoyEnv) bool {
	return statsdOn(e) || (!e.isTrue("DISABLE_STATS") && prometheusOn(e) && e.set("PROMETHEUS_MAPPER_YAML"))
}

// defaultMapperOn: envoy's own mapping, which
// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS changes, is in use.
func defaultMapperOn(e envoyEnv) bool { return prometheusOn(e) && !e.set("PROMETHEUS_MAPPER_YAML") }
func dogStatsdOn(e envoyEnv) bool     { return !e.isTrue("DISABLE_STATS") && e.isTrue("USE_DOG_STATSD") }
func prometheusOn(e envoyEnv) bool    { return e.isTrue("USE_PROMETHEUS") }
func memcacheOn(e envoyEnv) bool      { return e.get("BACKEND_TYPE") == "memcache" }
func perSecondOn(e envoyEnv) bool     { return e.isTrue("REDIS_PERSECOND") }
func tracingOn(e envoyEnv) bool       { return e.isTrue("TRACING_ENABLED") }
func redisOn(e envoyEnv) bool {
	return e.set("REDIS_URL") && !strings.Contains(e.getenv("REDIS_URL"), "://")
}
func redisTLSOn(e envoyEnv) bool { return redisOn(e) && e.isTrue("REDIS_TLS") }

func checkBool(v string) error {
	if _, err := strconv.ParseBool(v); err != nil {
		return errors.New("want true or false")
	}
	return nil
}

func checkInt(v string) error {
	if _, err := strconv.Atoi(v); err != nil {
		return errors.New("want a whole number")
	}
	return nil
}

// checkDuration accepts what envoy's settings accept: a Go duration, or a
// whole number of nanoseconds.
func checkDuration(v string) error {
	if _, err := time.ParseDuration(v); err != nil && checkInt(v) != nil {
		return errors.New("want a duration such as 10s")
	}
	return nil
}

func checkPoolWait(v string) error {
	if !strings.EqualFold(v, "WAIT") {
		return errors.New("envoyproxy/ratelimit refuses it too (it panics): remove the variable or set WAIT, and raise REDIS_POOL_SIZE if requests wait")
	}
	return nil
}

// envoyEnv reads envoy's variables, with envoy's defaults for those unset.
type envoyEnv struct{ getenv env }

// envoyIndex finds a variable of envoyVars by name. It is filled by init,
// as the table's functions read it.
var envoyIndex map[string]*envoyVar

func init() {
	envoyIndex = make(map[string]*envoyVar, len(envoyVars))
	for i := range envoyVars {
		envoyIndex[envoyVars[i].name] = &envoyVars[i]
	}
}

// set reports whether the variable is set (an empty value counts as unset).
func (e envoyEnv) set(name string) bool { return e.getenv(name) != "" }

// get returns the variable's value, or envoy's default when it is unset.
func (e envoyEnv) get(name string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	return envoyIndex[name].def
}

// isTrue reports whether a boolean variable is true; a value that is no
// boolean counts as false here, and applyEnvoyEnv refuses it.
func (e envoyEnv) isTrue(name string) bool {
	b, _ := strconv.ParseBool(e.get(name))
	return b
}

// boolean returns a boolean variable's value, or an error naming it.
func (e envoyEnv) boolean(name string) (bool, error) {
	b, err := strconv.ParseBool(e.get(name))
	if err != nil {
		return false, envoyErrorf(name, e.get(name), "want true or false")
	}
	return b, nil
}

// envoySetting is how every message names one of envoy's variables and
// its value: NAME="value", or for a variable that can carry a credential
// (envoyVar.secret, and any name not in the table) the name alone. No
// message about envoy's environment shows a value any other way.
func envoySetting(name, value string) string {
	if v := envoyIndex[name]; v == nil || v.secret {
		return name + " (value not shown)"
	}
	return fmt.Sprintf("%s=%q", name, value)
}

// envoyErrorf returns the error "SETTING: reason", with the setting as
// envoySetting shows it. The reasons written here never quote the value of
// a credential-bearing variable; an error among args (a flag's own, which
// may quote what it was given) is shown only for the other variables.
func envoyErrorf(name, value, format string, args ...any) error {
	if v := envoyIndex[name]; v == nil || v.secret {
		for i, a := range args {
			if _, ok := a.(error); ok {
				args[i] = "the value is refused"
			}
		}
	}
	return errors.New(envoySetting(name, value) + ": " + fmt.Sprintf(format, args...))
}
