package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/tiered"
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
	{name: "GRPC_SERVER_TLS_KEY", flag: "grpc-tls-key", on: grpcTLSOn, note: "--grpc-tls-key, with GRPC_SERVER_USE_TLS=true"},
	{name: "GRPC_CLIENT_TLS_CACERT", flag: "grpc-tls-client-ca", on: grpcTLSOn, note: "--grpc-tls-client-ca (clients must show a certificate), with GRPC_SERVER_USE_TLS=true"},
	{name: "GRPC_CLIENT_TLS_SAN", flag: "grpc-tls-client-san", on: grpcTLSOn, note: "--grpc-tls-client-san, with GRPC_SERVER_USE_TLS=true"},

	// Logs.
	{name: "LOG_LEVEL", def: "WARN", flag: "log-level", note: "--log-level: trace and debug are debug, warning is warn, fatal and panic are error; unset, tollgate's info (a few lines at start and stop)"},
	{name: "LOG_FORMAT", def: "text", flag: "log-format", note: "--log-format: json is json, anything else text"},

	// Where the rules come from.
	{name: "CONFIG_TYPE", def: "FILE", kind: envoyRefused, note: "tollgate reads its rules from files only, not over xDS: use CONFIG_TYPE=FILE and RUNTIME_ROOT"},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", def: "false", kind: envoyRefused, on: xdsOn, note: "xDS only (tollgate never starts without its rules)"},
	{name: "CONFIG_GRPC_XDS_NODE_ID", def: "default", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_SERVER_URL", def: "localhost:18000", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", def: "3s", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", def: "false", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", def: "10s", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", def: "60s", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", def: "0.5", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "XDS_CLIENT_BACKOFF_JITTER", def: "true", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", kind: envoyRefused, on: xdsOn, note: "xDS only: tollgate reads its rules from files"},
	{name: "RUNTIME_ROOT", def: "/srv/runtime_data/current", flag: "config", note: "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY"},
	{name: "RUNTIME_SUBDIRECTORY", flag: "config", note: "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY; unset while RUNTIME_WATCH_ROOT is true, envoy loads no rules at all, and tollgate wants --config"},
	{name: "RUNTIME_APPDIRECTORY", def: "config", flag: "config", note: "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY"},
	{name: "RUNTIME_IGNOREDOTFILES", def: "false", flag: "ignore-dotfiles", note: "--ignore-dotfiles: true skips files whose names start with a dot"},
	{name: "RUNTIME_WATCH_ROOT", def: "true", kind: envoySame, check: checkBool, note: "true or false, the rules are reloaded when their files change, replaced or moved into place (--watch, on by default; SIGHUP reloads too)"},
	{name: "MERGE_DOMAIN_CONFIG", def: "false", flag: "merge-domains", note: "--merge-domains: files of one domain are merged"},

	// Statistics.
	{name: "USE_STATSD", def: "true", off: "false", kind: envoyRefused, note: "tollgate sends no statsd: its metrics are Prometheus, on the HTTP listener's /metrics or, with USE_PROMETHEUS=true, on PROMETHEUS_ADDR; set USE_STATSD=false"},
	{name: "STATSD_HOST", def: "localhost", kind: envoyRefused, on: statsdOn, note: "tollgate sends no statsd (see USE_STATSD)"},
	{name: "STATSD_PORT", def: "8125", kind: envoyRefused, on: statsdOn, note: "tollgate sends no statsd (see USE_STATSD)"},
	{name: "USE_DOG_STATSD", def: "false", kind: envoyRefused, note: "tollgate sends no DogStatsD: scrape its Prometheus /metrics (the Datadog agent's OpenMetrics check reads it)"},
	{name: "USE_DOG_STATSD_MOGRIFIERS", kind: envoyRefused, on: dogStatsdOn, note: "tollgate sends no DogStatsD (see USE_DOG_STATSD)"},
	{name: "EXTRA_TAGS", kind: envoyRefused, note: "tollgate's metrics carry no extra tags: add labels where Prometheus scrapes them"},
	{name: "STATS_FLUSH_INTERVAL", def: "10s", kind: envoySame, check: checkDuration, note: "Prometheus reads the metrics when it scrapes: there is nothing to flush"},
	{name: "DISABLE_STATS", def: "false", kind: envoySame, check: checkBool, note: "the metrics cost nothing until /metrics is read: true or false, they are kept"},
	{name: "USE_PROMETHEUS", def: "false", flag: "prometheus-addr", note: "true: Prometheus metrics on a listener of their own, PROMETHEUS_ADDR and PROMETHEUS_PATH (also always on the HTTP listener's /metrics)"},
	{name: "PROMETHEUS_ADDR", def: ":9090", flag: "prometheus-addr", on: prometheusOn, note: "--prometheus-addr, with USE_PROMETHEUS=true"},
	{name: "PROMETHEUS_PATH", def: "/metrics", flag: "prometheus-path", on: prometheusOn, note: "--prometheus-path, with USE_PROMETHEUS=true"},
	{name: "PROMETHEUS_MAPPER_YAML", kind: envoyRefused, on: prometheusOn, note: "tollgate names its metrics itself (envoy's ratelimit_service_rate_limit_* among them): remove the mapper"},
	{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", def: "false", kind: envoyRefused, on: prometheusOn, note: "tollgate's durations are in seconds, as Prometheus names them: remove the variable"},

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
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", def: "false", kind: envoySame, check: checkBool, note: "tollgate does not start without valid rules, so it is never healthy without them"},
	{name: "SHADOW_MODE", def: "false", flag: "shadow-mode", note: "--shadow-mode"},
	{name: "QUOTA_MODE", def: "false", flag: "quota-mode", note: "--quota-mode: every rule is a quota rule"},
	{name: "RESPONSE_DYNAMIC_METADATA", def: "false", flag: "response-dynamic-metadata", note: "--response-dynamic-metadata"},

	// Redis.
	{name: "REDIS_SOCKET_TYPE", def: "unix", flag: "redis", on: redisOn, note: "tcp; unix is refused: tollgate reaches Redis over TCP only"},
	{name: "REDIS_TYPE", def: "SINGLE", flag: "redis", on: redisOn, note: "SINGLE is redis://, SENTINEL redis+sentinel://, CLUSTER redis+cluster://"},
	{name: "REDIS_URL", def: "/var/run/nutcracker/ratelimit.sock", flag: "redis", note: "--redis: host:port; master,sentinel:port,… for SENTINEL; host:port,host:port for CLUSTER; a redis:// URL is taken as it is. Unset, the memory store (one instance)"},
	{name: "REDIS_POOL_SIZE", def: "10", flag: "redis", on: redisOn, note: "the --redis URL's pool_size"},
	{name: "REDIS_AUTH", flag: "redis", on: redisOn, note: "\"user:password\" or \"password\": the password is passed as $REDIS_AUTH is outside envoy mode, never in the URL; a user name goes into the --redis URL (with a redis:// REDIS_URL, put the user name in that URL)"},
	{name: "REDIS_SENTINEL_AUTH", flag: "redis", on: redisOn, note: "the sentinels' own \"user:password\" or \"password\", in the --redis URL's user information (removed from every log line and error)"},
	{name: "REDIS_TLS", def: "false", flag: "redis", on: redisOn, note: "true: rediss:// (TLS)"},
	{name: "REDIS_TLS_CLIENT_CERT", flag: "redis-tls-cert", on: redisTLSOn, note: "--redis-tls-cert, with REDIS_TLS=true"},
	{name: "REDIS_TLS_CLIENT_KEY", flag: "redis-tls-key", on: redisTLSOn, note: "--redis-tls-key, with REDIS_TLS=true"},
	{name: "REDIS_TLS_CACERT", flag: "redis-tls-ca", on: redisTLSOn, note: "--redis-tls-ca, with REDIS_TLS=true"},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", flag: "redis-tls-skip-verify-hostname", on: redisTLSOn, note: "--redis-tls-skip-verify-hostname, with REDIS_TLS=true"},
	{name: "REDIS_TIMEOUT", def: "10s", flag: "redis", on: redisOn, note: "the --redis URL's dial_timeout (envoy bounds connecting by it; each request's Redis calls are bounded by --timeout)"},
	{name: "REDIS_PIPELINE_WINDOW", def: "0", flag: "redis-pipeline", note: "--redis-pipeline; unset, tollgate's 50µs"},
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
	{name: "REDIS_PERSECOND_URL", def: "/var/run/nutcracker/ratelimitpersecond.sock", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_POOL_SIZE", def: "10", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_AUTH", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TLS", def: "false", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_SENTINEL_AUTH", kind: envoyRefused, on: perSecondOn, note: "one Redis for every limit (see REDIS_PERSECOND)"},
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
	{name: "MEMCACHE_TLS_CLIENT_KEY", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_TLS_CACERT", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},
	{name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", kind: envoyRefused, on: memcacheOn, note: "tollgate's shared store is Redis (see BACKEND_TYPE)"},

	// Tracing.
	{name: "TRACING_ENABLED", def: "false", flag: "tracing", note: "--tracing"},
	{name: "TRACING_SERVICE_NAME", def: "RateLimit", flag: "tracing-service-name", on: tracingOn, note: "--tracing-service-name, envoy's default with TRACING_ENABLED=true"},
	{name: "TRACING_SERVICE_NAMESPACE", flag: "tracing-service-namespace", on: tracingOn, note: "--tracing-service-namespace"},
	{name: "TRACING_SERVICE_INSTANCE_ID", flag: "tracing-service-instance-id", on: tracingOn, note: "--tracing-service-instance-id"},
	{name: "TRACING_EXPORTER_PROTOCOL", def: "http", flag: "tracing-exporter-protocol", on: tracingOn, note: "--tracing-exporter-protocol, envoy's default with TRACING_ENABLED=true"},
	{name: "TRACING_SAMPLING_RATE", def: "1", flag: "tracing-sampling-rate", on: tracingOn, note: "--tracing-sampling-rate, envoy's default with TRACING_ENABLED=true"},
	{name: "OTEL_EXPORTER_OTLP_ENDPOINT", kind: envoySame, on: tracingOn, note: "tollgate's tracing reads OpenTelemetry's OTEL_EXPORTER_OTLP_* variables as envoy's does, after --tracing-endpoint (it alone does not turn envoy mode on)"},
}

// The switches that say whether a group of variables matters (envoyVar.on).
func grpcTLSOn(e envoyEnv) bool    { return e.isTrue("GRPC_SERVER_USE_TLS") }
func xdsOn(e envoyEnv) bool        { return !strings.EqualFold(e.get("CONFIG_TYPE"), "FILE") }
func statsdOn(e envoyEnv) bool     { return e.isTrue("USE_STATSD") || e.isTrue("USE_DOG_STATSD") }
func dogStatsdOn(e envoyEnv) bool  { return e.isTrue("USE_DOG_STATSD") }
func prometheusOn(e envoyEnv) bool { return e.isTrue("USE_PROMETHEUS") }
func memcacheOn(e envoyEnv) bool   { return e.get("BACKEND_TYPE") == "memcache" }
func perSecondOn(e envoyEnv) bool  { return e.isTrue("REDIS_PERSECOND") }
func tracingOn(e envoyEnv) bool    { return e.isTrue("TRACING_ENABLED") }
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
		return false, fmt.Errorf("%s=%q: want true or false", name, e.get(name))
	}
	return b, nil
}

// envoyModeOn reports whether envoy's environment is in use: whether any
// of its variables is set, but for those tollgate reads with the same
// meaning outside envoy mode (REDIS_URL as a URL, REDIS_AUTH) and for
// OpenTelemetry's own.
func envoyModeOn(getenv env) bool {
	for _, v := range envoyVars {
		val := getenv(v.name)
		switch {
		case val == "", v.name == "REDIS_AUTH", strings.HasPrefix(v.name, "OTEL_"):
		case v.name == "REDIS_URL" && strings.Contains(val, "://"):
		default:
			return true
		}
	}
	return false
}

// envoyBuilt are the flags whose values come from several variables, or
// that envoy mode sets whatever the environment says; each function
// returns the flag's value, or false to leave the flag alone.
var envoyBuilt = map[string]func(e envoyEnv) (string, bool, error){
	"http":  func(e envoyEnv) (string, bool, error) { return e.hostPort("HOST", "PORT") },
	"grpc":  func(e envoyEnv) (string, bool, error) { return e.hostPort("GRPC_HOST", "GRPC_PORT") },
	"debug": func(e envoyEnv) (string, bool, error) { return e.hostPort("DEBUG_HOST", "DEBUG_PORT") },
	"config": func(e envoyEnv) (string, bool, error) {
		watchRoot, err := e.boolean("RUNTIME_WATCH_ROOT")
		if err != nil || (watchRoot && !e.set("RUNTIME_SUBDIRECTORY")) {
			// envoy loads no rules at all then: tollgate wants --config.
			return "", false, err
		}
		return path.Join(e.get("RUNTIME_ROOT"), e.get("RUNTIME_SUBDIRECTORY"), e.get("RUNTIME_APPDIRECTORY")), true, nil
	},
	"redis": envoyRedisURL,
	"headers": func(e envoyEnv) (string, bool, error) {
		on, err := e.boolean("LIMIT_RESPONSE_HEADERS_ENABLED")
		if on {
			return "ratelimit", true, err
		}
		return "none", true, err
	},
	"grpc-tls-cert": func(e envoyEnv) (string, bool, error) {
		on, err := e.boolean("GRPC_SERVER_USE_TLS")
		if err != nil || !on {
			return "", false, err
		}
		if !e.set("GRPC_SERVER_TLS_CERT") || !e.set("GRPC_SERVER_TLS_KEY") {
			return "", false, errors.New("GRPC_SERVER_USE_TLS=true: set GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY too")
		}
		return e.getenv("GRPC_SERVER_TLS_CERT"), true, nil
	},
	"prometheus-addr": func(e envoyEnv) (string, bool, error) {
		on, err := e.boolean("USE_PROMETHEUS")
		return e.get("PROMETHEUS_ADDR"), on, err
	},
	"prometheus-path": func(e envoyEnv) (string, bool, error) {
		return e.get("PROMETHEUS_PATH"), prometheusOn(e), nil
	},
	"ignore-dotfiles": func(e envoyEnv) (string, bool, error) {
		b, err := e.boolean("RUNTIME_IGNOREDOTFILES")
		return strconv.FormatBool(b), true, err
	},
	"tracing": func(e envoyEnv) (string, bool, error) {
		b, err := e.boolean("TRACING_ENABLED")
		return strconv.FormatBool(b), e.set("TRACING_ENABLED"), err
	},
	// With tracing on, envoy's defaults for these rather than tollgate's.
	"tracing-service-name":      func(e envoyEnv) (string, bool, error) { return e.get("TRACING_SERVICE_NAME"), tracingOn(e), nil },
	"tracing-exporter-protocol": func(e envoyEnv) (string, bool, error) { return e.get("TRACING_EXPORTER_PROTOCOL"), tracingOn(e), nil },
	"tracing-sampling-rate":     func(e envoyEnv) (string, bool, error) { return e.get("TRACING_SAMPLING_RATE"), tracingOn(e), nil },
}

// envoyConvert turns the value of a variable that alone sets a flag into
// the flag's value, where the two are spelt differently.
var envoyConvert = map[string]func(v string) (string, error){
	"LOG_LEVEL": func(v string) (string, error) {
		switch strings.ToLower(v) {
		case "trace", "debug":
			return "debug", nil
		case "info":
			return "info", nil
		case "warn", "warning":
			return "warn", nil
		case "error", "fatal", "panic":
			return "error", nil
		}
		return "", errors.New("want trace, debug, info, warn, warning, error, fatal or panic")
	},
	"LOG_FORMAT": func(v string) (string, error) {
		if strings.EqualFold(v, "json") {
			return "json", nil
		}
		return "text", nil
	},
}

// hostPort joins two listener variables into an address.
func (e envoyEnv) hostPort(host, port string) (string, bool, error) {
	p := e.get(port)
	if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
		return "", false, fmt.Errorf("%s=%q: want a port number", port, p)
	}
	return net.JoinHostPort(e.get(host), p), true, nil
}

// envoyRedisURL builds the --redis URL from REDIS_URL and its companions.
// REDIS_AUTH's password stays out of it (see envoyRedisEnv); REDIS_URL
// unset leaves --redis alone.
func envoyRedisURL(e envoyEnv) (string, bool, error) {
	raw := e.getenv("REDIS_URL")
	if raw == "" {
		return "", false, nil
	}
	if strings.Contains(raw, "://") {
		return raw, true, nil // tollgate's own URL form
	}
	if st := strings.ToLower(e.get("REDIS_SOCKET_TYPE")); st != "tcp" {
		return "", false, fmt.Errorf("REDIS_SOCKET_TYPE=%q: tollgate reaches Redis over TCP only; set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port", e.get("REDIS_SOCKET_TYPE"))
	}
	tls, err := e.boolean("REDIS_TLS")
	if err != nil {
		return "", false, err
	}
	q := url.Values{}
	if e.set("REDIS_POOL_SIZE") {
		if n, err := strconv.Atoi(e.get("REDIS_POOL_SIZE")); err != nil || n <= 0 {
			return "", false, fmt.Errorf("REDIS_POOL_SIZE=%q: want a positive whole number", e.get("REDIS_POOL_SIZE"))
		}
	}
	q.Set("pool_size", e.get("REDIS_POOL_SIZE"))
	d, err := time.ParseDuration(e.get("REDIS_TIMEOUT"))
	if err != nil || d < 0 {
		return "", false, fmt.Errorf("REDIS_TIMEOUT=%q: want a duration such as 10s", e.get("REDIS_TIMEOUT"))
	}
	q.Set("dial_timeout", d.String())
	user, _, hasUser := strings.Cut(e.getenv("REDIS_AUTH"), ":")
	u := &url.URL{Scheme: "redis"}
	if tls {
		u.Scheme = "rediss"
	}
	addrs := strings.Split(raw, ",")
	switch typ := strings.ToLower(e.get("REDIS_TYPE")); typ {
	case "single":
		if len(addrs) != 1 {
			return "", false, fmt.Errorf("REDIS_URL=%q: REDIS_TYPE SINGLE wants one host:port", raw)
		}
	case "cluster":
		u.Scheme += "+cluster"
	case "sentinel":
		if len(addrs) < 2 {
			return "", false, fmt.Errorf("REDIS_URL=%q: REDIS_TYPE SENTINEL wants master-name,host:port[,host:port…]", raw)
		}
		u.Scheme += "+sentinel"
		q.Set("master_name", addrs[0])
		addrs = addrs[1:]
		if hasUser {
			q.Set("username", user) // the master's; the user information is the sentinels'
		}
		hasUser = false
		if sa := e.getenv("REDIS_SENTINEL_AUTH"); sa != "" {
			su, sp, ok := strings.Cut(sa, ":")
			if ok {
				u.User = url.UserPassword(su, sp)
			} else {
				u.User = url.UserPassword("", sa)
			}
		}
	default:
		return "", false, fmt.Errorf("REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", e.get("REDIS_TYPE"))
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return "", false, fmt.Errorf("REDIS_URL=%q: %q is no host:port", raw, a)
		}
	}
	if hasUser && user != "" {
		u.User = url.User(user)
	}
	u.Host = addrs[0]
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u.RawQuery = q.Encode()
	return u.String(), true, nil
}

// envoyRedisEnv is the environment resolveRedis reads: in envoy mode
// REDIS_AUTH may be envoy's "user:password", whose user name envoyRedisURL
// put into the URL, so only the password is passed on; elsewhere it is
// getenv itself.
func envoyRedisEnv(getenv env) env {
	if !envoyModeOn(getenv) {
		return getenv
	}
	return func(name string) string {
		v := getenv(name)
		if name == "REDIS_AUTH" {
			if _, pw, ok := strings.Cut(v, ":"); ok {
				return pw
			}
		}
		return v
	}
}

// applyEnvoyEnv sets the flags of fs from envoyproxy/ratelimit's variables
// in getenv, before fs.Parse, so that the command line still wins. It
// reports whether envoy mode is on (any of envoy's variables set; without
// it, nothing changes), and returns every refusal together: a refused
// variable, a value tollgate cannot read, or a variable whose flag this
// build of tollgate lacks.
func applyEnvoyEnv(fs *flag.FlagSet, getenv env) (bool, error) {
	if !envoyModeOn(getenv) {
		return false, nil
	}
	e := envoyEnv{getenv}
	var errs []error
	for _, v := range envoyVars {
		if err := v.accept(e); err != nil {
			errs = append(errs, err)
		}
	}
	// Each flag once, in the table's order.
	done := map[string]bool{}
	for _, v := range envoyVars {
		if v.kind != envoyHonoured || done[v.flag] {
			continue
		}
		done[v.flag] = true
		val, ok, err := envoyFlagValue(e, v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		if fs.Lookup(v.flag) == nil {
			if e.set(v.name) && !sameSetting(v.def, e.getenv(v.name)) {
				errs = append(errs, fmt.Errorf("%s=%q: this tollgate has no --%s flag to carry it", v.name, e.getenv(v.name), v.flag))
			}
			continue // envoy's default, for a flag this build lacks
		}
		if err := fs.Set(v.flag, val); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: --%s: %w", v.name, getenv(v.name), v.flag, err))
		}
	}
	for _, f := range envoyModeFlags {
		if fs.Lookup(f.name) == nil {
			continue // a build without it answers as tollgate does
		}
		if err := fs.Set(f.name, f.value); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.name, err))
		}
	}
	return true, errors.Join(errs...)
}

// envoyModeFlags are the flags envoy mode sets with no variable of
// envoy's behind them: answers as envoy gives them, and the rules read as
// envoy's runtime reads them (every file of the tree, not only *.yaml).
var envoyModeFlags = []struct{ name, value string }{
	{"compat", "envoy"},
	{"runtime-tree", "true"},
}

// accept returns the refusal of v's value, if any.
func (v envoyVar) accept(e envoyEnv) error {
	val := e.getenv(v.name)
	if val == "" || (v.on != nil && !v.on(e)) {
		return nil
	}
	switch v.kind {
	case envoySame:
		if v.check != nil {
			if err := v.check(val); err != nil {
				return fmt.Errorf("%s=%q: %w", v.name, val, err)
			}
		}
	case envoyRefused:
		accepted := v.def
		if v.off != "" {
			accepted = v.off
		}
		if !sameSetting(accepted, val) {
			return fmt.Errorf("%s=%q: %s", v.name, val, v.note)
		}
	}
	return nil
}

// envoyFlagValue returns the value of v's flag: built from several
// variables, or v's own value when it is set and matters.
func envoyFlagValue(e envoyEnv, v envoyVar) (string, bool, error) {
	if build, ok := envoyBuilt[v.flag]; ok {
		return build(e)
	}
	val := e.getenv(v.name)
	if val == "" || (v.on != nil && !v.on(e)) {
		return "", false, nil
	}
	if conv, ok := envoyConvert[v.name]; ok {
		c, err := conv(val)
		if err != nil {
			return "", false, fmt.Errorf("%s=%q: %w", v.name, val, err)
		}
		return c, true, nil
	}
	return val, true, nil
}

// sameSetting reports whether value says what envoy's default def says:
// equal but for case, or the same boolean, number or duration spelt
// differently.
func sameSetting(def, value string) bool {
	if strings.EqualFold(def, value) {
		return true
	}
	if a, err := strconv.ParseBool(def); err == nil {
		b, err := strconv.ParseBool(value)
		return err == nil && a == b
	}
	if a, err := time.ParseDuration(def); err == nil {
		b, err := time.ParseDuration(value)
		return err == nil && a == b
	}
	if a, err := strconv.ParseFloat(def, 64); err == nil {
		b, err := strconv.ParseFloat(value, 64)
		return err == nil && a == b
	}
	return false
}

// envoyExtras are the flags serve has for envoy's variables that no other
// part of tollgate needed: a Prometheus listener of its own and the local
// cache of denials.
type envoyExtras struct {
	promAddr, promPath string
	localCacheBytes    int
}

func (x *envoyExtras) register(fs *flag.FlagSet) {
	fs.StringVar(&x.promAddr, "prometheus-addr", "", "also serve the Prometheus metrics on this address, alone (envoy's USE_PROMETHEUS and PROMETHEUS_ADDR); they are always on the HTTP listener's /metrics")
	fs.StringVar(&x.promPath, "prometheus-path", "/metrics", "the path of the metrics on --prometheus-addr")
	fs.IntVar(&x.localCacheBytes, "local-cache-bytes", 0, "with Redis: remember keys over their limit in about this many bytes of memory and deny them locally, without a Redis call, until they could pass (envoy's LOCAL_CACHE_SIZE_IN_BYTES); 0 remembers none")
}

func (x *envoyExtras) check() error {
	if x.localCacheBytes < 0 {
		return fmt.Errorf("--local-cache-bytes %d: want 0 or more", x.localCacheBytes)
	}
	if !strings.HasPrefix(x.promPath, "/") {
		return fmt.Errorf("--prometheus-path %q: want a path starting with /", x.promPath)
	}
	return nil
}

// localCacheEntryBytes is about what the local cache holds per key: the
// key (up to about a hundred bytes), what the Redis store last answered
// for it, and the table's own overhead.
const localCacheEntryBytes = 384

// localCacheKeys is how many keys a local cache of so many bytes holds.
func localCacheKeys(bytes int) int { return max(1, bytes/localCacheEntryBytes) }

// withLocalCache puts a local cache of denials in front of the Redis
// store rs, when --local-cache-bytes asks for one. It answers only what
// Redis would certainly answer (a denial, with Redis's own numbers), and
// leaves failures to --failure-mode as before: the cache decides nothing
// while Redis is down, and sets no deadline beyond --timeout.
func (x *envoyExtras) withLocalCache(rs tollgate.Store, log *slog.Logger) tollgate.Store {
	if x.localCacheBytes <= 0 {
		return rs
	}
	log.Info("local cache of denials in front of Redis", "bytes", x.localCacheBytes, "keys", localCacheKeys(x.localCacheBytes))
	return tiered.New(rs, tiered.WithMaxKeys(localCacheKeys(x.localCacheBytes)), tiered.WithoutDegradedMode(),
		tiered.WithTimeout(0), tiered.WithLogger(log))
}

// servePrometheus serves srv's metrics on --prometheus-addr until the
// returned server is closed; it returns nil when there is none.
func (x *envoyExtras) servePrometheus(srv *service.Server, conns *connFlags, log *slog.Logger) (*http.Server, error) {
	if x.promAddr == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", x.promAddr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+x.promPath, promhttp.HandlerFor(srv.Registry(), promhttp.HandlerOpts{Registry: srv.Registry()}))
	ps := conns.httpServer(mux, log)
	go ps.Serve(l)
	log.Info("prometheus listening", "addr", l.Addr().String(), "path", x.promPath)
	return ps, nil
}

// logEnvoyEnv says, in envoy mode, which of envoy's variables the service
// took, and which it leaves unused because envoy would too (their switch is
// off: STATSD_HOST without statsd, MEMCACHE_* without memcache, …), so that
// none goes unmentioned.
func logEnvoyEnv(log *slog.Logger, getenv env) {
	if !envoyModeOn(getenv) {
		return
	}
	e := envoyEnv{getenv}
	var read, unused []string
	for _, v := range envoyVars {
		switch {
		case !e.set(v.name):
		case v.on != nil && !v.on(e):
			unused = append(unused, v.name)
		default:
			read = append(read, v.name)
		}
	}
	log.Info("envoyproxy/ratelimit environment (docs/envoy-environment.md)", "read", strings.Join(read, ","), "unused_as_in_envoy", strings.Join(unused, ","))
}
