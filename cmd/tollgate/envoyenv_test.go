package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// envOf turns "NAME=value" pairs into a getenv.
func envOf(kv ...string) env {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(name string) string { return m[name] }
}

// tableFlags returns a FlagSet with a string flag for every flag the table
// names (and those of envoyModeFlags): where the mapping alone is tested, independent of
// which flags this build's serve has.
func tableFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, name := range envoyFlagNames() {
		fs.String(name, "", "")
	}
	return fs
}

// envoyFlagNames is every flag applyEnvoyEnv may set.
func envoyFlagNames() []string {
	var names []string
	for _, f := range envoyModeFlags {
		names = append(names, f.name)
	}
	for _, v := range envoyVars {
		if v.flag != "" && !slices.Contains(names, v.flag) {
			names = append(names, v.flag)
		}
	}
	return names
}

// setFlags returns the flags of fs that were set, as "name=value".
func setFlags(fs *flag.FlagSet) map[string]string {
	m := map[string]string{}
	fs.Visit(func(f *flag.Flag) { m[f.Name] = f.Value.String() })
	return m
}

// compose is the environment of envoyproxy/ratelimit's docker-compose
// example, on this machine.
var compose = []string{"USE_STATSD=false", "LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379",
	"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "MEMCACHE_HOST_PORT=memcached:11211"}

// egRelease is a range of Envoy Gateway releases that give the rate limit
// service's Deployment one environment.
type egRelease int

const (
	// egV10 is v1.0.0 to v1.1.0: USE_STATSD=false, so that the
	// statsd_exporter sidecar beside the service receives nothing.
	egV10 egRelease = iota
	// egV111 is v1.1.1 to v1.1.x: USE_STATSD=true and STATSD_PORT=9125,
	// into the sidecar.
	egV111
	// egV12 is v1.2.0 and later: no sidecar, the mapping applied in
	// process (USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_MAPPER_YAML).
	egV12
)

// envoyGateway is the environment Envoy Gateway's release r gives the rate
// limit service's Deployment (expectedRateLimitContainerEnv in its
// internal/infrastructure/kubernetes/ratelimit/resource.go), in its order,
// with a Redis backend and certificates under dir. GRPC_SERVER_TLS_CA_CERT
// is none of envoy's variables: envoy does not read it, nor does tollgate.
func envoyGateway(dir string, r egRelease) []string {
	env := []string{"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=info"}
	if r == egV111 {
		env = append(env, "USE_STATSD=true", "STATSD_PORT=9125")
	} else {
		env = append(env, "USE_STATSD=false")
	}
	env = append(env, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+dir+"/tls.crt", "GRPC_SERVER_TLS_KEY="+dir+"/tls.key", "GRPC_SERVER_TLS_CA_CERT="+dir+"/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+dir+"/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+dir+"/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT="+dir+"/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379")
	if r == egV12 {
		env = append(env, "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001", "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml")
	}
	return env
}

// xdsDefaults are the flags envoy mode sets with rules over xDS: those of
// envoyDefaults but --ignore-dotfiles, which is about files.
func xdsDefaults(more map[string]string) map[string]string {
	m := envoyDefaults(more)
	delete(m, "ignore-dotfiles")
	return m
}

// envoyDefaults are the flags envoy mode sets whatever the environment
// (statsd to localhost:8125, as USE_STATSD is true by default), with more;
// a flag of more with the value "" is one left alone.
func envoyDefaults(more map[string]string) map[string]string {
	m := map[string]string{
		"http": "0.0.0.0:8080", "grpc": "0.0.0.0:8081", "debug": "0.0.0.0:6070",
		"headers": "none", "compat": "envoy", "runtime-tree": "true", "ignore-dotfiles": "false",
		"statsd": "localhost:8125",
	}
	for k, v := range more {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

// noStatsd is "statsd" left alone, for envoyDefaults.
const noStatsd = ""

// egFlags are the flags every release of Envoy Gateway's environment sets,
// with more.
func egFlags(more map[string]string) map[string]string {
	m := map[string]string{
		"xds": "envoy-gateway:18001", "xds-node-id": "envoy-ratelimit", "xds-force-start": "true",
		"xds-tls": "true", "xds-tls-cert": "/certs/tls.crt", "xds-tls-key": "/certs/tls.key", "xds-tls-ca": "/certs/ca.crt",
		"grpc-tls-cert": "/certs/tls.crt", "grpc-tls-key": "/certs/tls.key",
		"redis": "redis://redis:6379?dial_timeout=10s&pool_size=10", "log-level": "info",
	}
	for k, v := range more {
		m[k] = v
	}
	return xdsDefaults(m)
}

func TestEnvoyEnvMapping(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  []string
		want map[string]string // every flag set, with its value
	}{
		{"no envoy variable", nil, map[string]string{}},
		{"tollgate's own REDIS_URL and REDIS_AUTH", []string{"REDIS_URL=redis://127.0.0.1:6379", "REDIS_AUTH=pw", "OTEL_EXPORTER_OTLP_ENDPOINT=http://x",
			"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer x"}, map[string]string{}},
		{"docker-compose example", compose, envoyDefaults(map[string]string{
			"statsd": noStatsd, "log-level": "debug", "config": "/data/ratelimit/config",
			"redis": "redis://redis:6379?dial_timeout=10s&pool_size=10",
		})},
		{"listeners", []string{"HOST=127.0.0.1", "PORT=9000", "GRPC_HOST=::1", "GRPC_PORT=9001", "DEBUG_HOST=127.0.0.2", "DEBUG_PORT=9002"}, envoyDefaults(map[string]string{
			"http": "127.0.0.1:9000", "grpc": "[::1]:9001", "debug": "127.0.0.2:9002",
		})},
		{"runtime directories", []string{"RUNTIME_ROOT=/srv/rt", "RUNTIME_SUBDIRECTORY=rl", "RUNTIME_APPDIRECTORY=app", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false", "MERGE_DOMAIN_CONFIG=true"}, envoyDefaults(map[string]string{
			"config": "/srv/rt/rl/app", "ignore-dotfiles": "true", "merge-domains": "true",
		})},
		{"runtime root without a subdirectory, not watched", []string{"RUNTIME_WATCH_ROOT=false"}, envoyDefaults(map[string]string{"config": "/srv/runtime_data/current/config"})},
		// envoy loads no rules at all then: --config must say where they are.
		{"runtime root without a subdirectory, watched", []string{"RUNTIME_ROOT=/srv/rt"}, envoyDefaults(nil)},
		{"answers", []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_LIMIT_HEADER=X-L", "LIMIT_REMAINING_HEADER=X-R", "LIMIT_RESET_HEADER=X-T",
			"NEAR_LIMIT_RATIO=0.9", "SHADOW_MODE=true", "QUOTA_MODE=1", "RESPONSE_DYNAMIC_METADATA=true", "CACHE_KEY_PREFIX=rl_", "LOCAL_CACHE_SIZE_IN_BYTES=1048576"}, envoyDefaults(map[string]string{
			"headers": "ratelimit", "header-limit": "X-L", "header-remaining": "X-R", "header-reset": "X-T", "near-limit-ratio": "0.9",
			"shadow-mode": "true", "quota-mode": "1", "response-dynamic-metadata": "true", "redis-prefix": "rl_", "local-cache-bytes": "1048576",
		})},
		{"logs", []string{"LOG_LEVEL=WARNING", "LOG_FORMAT=JSON"}, envoyDefaults(map[string]string{"log-level": "warn", "log-format": "json"})},
		{"log level trace", []string{"LOG_LEVEL=trace", "LOG_FORMAT=logfmt"}, envoyDefaults(map[string]string{"log-level": "debug", "log-format": "text"})},
		{"prometheus", []string{"USE_STATSD=false", "USE_PROMETHEUS=true"}, envoyDefaults(map[string]string{"statsd": noStatsd, "prometheus-addr": ":9090", "prometheus-path": "/metrics"})},
		{"prometheus elsewhere", []string{"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:9102", "PROMETHEUS_PATH=/m"}, envoyDefaults(map[string]string{"statsd": noStatsd, "prometheus-addr": "127.0.0.1:9102", "prometheus-path": "/m"})},
		{"Envoy Gateway v1.2 and later", []string{"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001", "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml", "STATS_FLUSH_INTERVAL=2s", "EXTRA_TAGS=a:b"},
			envoyDefaults(map[string]string{"statsd": noStatsd, "prometheus-addr": ":19001", "prometheus-path": "/metrics", "prometheus-mapper": "/etc/statsd-exporter/conf.yaml", "stats-flush": "2s", "stats-tags": "a:b"})},
		{"Envoy Gateway v1.0 and v1.1", []string{"USE_STATSD=true", "STATSD_PORT=9125"}, envoyDefaults(map[string]string{"statsd": "localhost:9125"})},
		{"statsd", []string{"STATSD_HOST=statsd", "STATSD_PORT=9125", "STATSD_PROTOCOL=udp", "EXTRA_TAGS=a:b,c:d", "STATS_FLUSH_INTERVAL=1000000000", "GOSTATS_FLUSH_INTERVAL_SECONDS=5"},
			envoyDefaults(map[string]string{"statsd": "statsd:9125", "statsd-protocol": "udp", "stats-tags": "a:b,c:d", "stats-flush": "1000000000ns"})},
		{"stats disabled", []string{"DISABLE_STATS=true", "STATSD_HOST=statsd", "STATS_FLUSH_INTERVAL=1s", "EXTRA_TAGS=a:b", "USE_PROMETHEUS=true", "PROMETHEUS_MAPPER_YAML=/m.yaml"},
			envoyDefaults(map[string]string{"statsd": noStatsd, "prometheus-addr": ":9090", "prometheus-path": "/metrics"})},
		{"prometheus variables while it is off", []string{"PROMETHEUS_ADDR=127.0.0.1:9102", "PROMETHEUS_MAPPER_YAML=/m.yaml"}, envoyDefaults(nil)},
		{"redis with user and TLS", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=10.0.0.1:6380", "REDIS_AUTH=app:pw", "REDIS_TLS=true", "REDIS_POOL_SIZE=20", "REDIS_TIMEOUT=2s",
			"REDIS_TLS_CACERT=/ca.pem", "REDIS_TLS_CLIENT_CERT=/c.pem", "REDIS_TLS_CLIENT_KEY=/k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true", "REDIS_PIPELINE_WINDOW=150us"}, envoyDefaults(map[string]string{
			"redis":        "rediss://app@10.0.0.1:6380?dial_timeout=2s&pool_size=20",
			"redis-tls-ca": "/ca.pem", "redis-tls-cert": "/c.pem", "redis-tls-key": "/k.pem", "redis-tls-skip-verify-hostname": "true", "redis-pipeline": "150us",
		})},
		{"redis password alone", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=10.0.0.1:6379", "REDIS_AUTH=pw"}, envoyDefaults(map[string]string{
			"redis": "redis://10.0.0.1:6379?dial_timeout=10s&pool_size=10",
		})},
		{"redis TLS files without REDIS_TLS", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=10.0.0.1:6379", "REDIS_TLS_CACERT=/ca.pem"}, envoyDefaults(map[string]string{
			"redis": "redis://10.0.0.1:6379?dial_timeout=10s&pool_size=10",
		})},
		{"redis cluster", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=cluster", "REDIS_URL=n1:7000,n2:7001,n3:7002"}, envoyDefaults(map[string]string{
			"redis": "redis+cluster://n1:7000?addr=n2%3A7001&addr=n3%3A7002&dial_timeout=10s&pool_size=10",
		})},
		{"redis sentinel", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster,s1:26379,s2:26379", "REDIS_AUTH=app:pw", "REDIS_SENTINEL_AUTH=sp"}, envoyDefaults(map[string]string{
			"redis": "redis+sentinel://:sp@s1:26379?addr=s2%3A26379&dial_timeout=10s&master_name=mymaster&pool_size=10&username=app",
		})},
		{"redis URL of tollgate's", []string{"REDIS_URL=redis+cluster://n1:7000", "PORT=8080"}, envoyDefaults(map[string]string{"redis": "redis+cluster://n1:7000"})},
		{"grpc TLS", []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_CLIENT_TLS_CACERT=/ca", "GRPC_CLIENT_TLS_SAN=envoy"}, envoyDefaults(map[string]string{
			"grpc-tls-cert": "/c", "grpc-tls-key": "/k", "grpc-tls-client-ca": "/ca", "grpc-tls-client-san": "envoy",
		})},
		{"grpc TLS files while it is off", []string{"GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k"}, envoyDefaults(nil)},
		{"tracing", []string{"TRACING_ENABLED=true", "TRACING_SERVICE_NAMESPACE=ns", "TRACING_SERVICE_INSTANCE_ID=i1", "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel:4318"}, envoyDefaults(map[string]string{
			"tracing": "true", "tracing-service-name": "RateLimit", "tracing-service-namespace": "ns", "tracing-service-instance-id": "i1",
			"tracing-exporter-protocol": "http", "tracing-sampling-rate": "1",
		})},
		{"envoy gateway v1.0-1.1.0", envoyGateway("/certs", egV10), egFlags(map[string]string{"statsd": noStatsd})},
		{"envoy gateway v1.1.1-1.1", envoyGateway("/certs", egV111), egFlags(map[string]string{"statsd": "localhost:9125"})},
		{"envoy gateway v1.2-", envoyGateway("/certs", egV12), egFlags(map[string]string{"statsd": noStatsd,
			"prometheus-addr": ":19001", "prometheus-path": "/metrics", "prometheus-mapper": "/etc/statsd-exporter/conf.yaml"})},
		{"every xDS variable", []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=cp:18000", "CONFIG_GRPC_XDS_NODE_METADATA=a=b,c=d",
			"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=1s", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer x",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_SERVER_TLS_SAN=cp.example", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=1s",
			"XDS_CLIENT_BACKOFF_MAX_INTERVAL=5000000000", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR=0.2", "XDS_CLIENT_BACKOFF_JITTER=false",
			"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=8388608", "MERGE_DOMAIN_CONFIG=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=false"}, xdsDefaults(map[string]string{
			"xds": "cp:18000", "xds-node-metadata": "a=b,c=d", "xds-tls": "true", "xds-tls-server-name": "cp.example",
			"xds-backoff-initial": "1s", "xds-backoff-max": "5000000000ns", "xds-backoff-random-factor": "0.2", "xds-backoff-jitter": "false",
			"xds-max-message-bytes": "8388608", "merge-domains": "true",
		})},
		{"xDS variables of rules from files", []string{"CONFIG_TYPE=FILE", "RUNTIME_WATCH_ROOT=false", "CONFIG_GRPC_XDS_SERVER_URL=cp:18000", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
			"XDS_CLIENT_BACKOFF_JITTER=maybe", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=x"}, envoyDefaults(map[string]string{"config": "/srv/runtime_data/current/config"})},
		{"defaults of refused variables", []string{"USE_DOG_STATSD=0", "BACKEND_TYPE=redis", "CONFIG_TYPE=file", "REDIS_PERSECOND=false",
			"GRPC_MAX_CONNECTION_AGE=24h0m", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR=0.50"}, envoyDefaults(nil)},
		{"variables of what is off", []string{"USE_STATSD=false", "STATSD_HOST=statsd", "CONFIG_GRPC_XDS_SERVER_URL=xds:18000", "REDIS_PERSECOND_URL=rl2:6379",
			"MEMCACHE_SRV=_mc._tcp", "USE_DOG_STATSD_MOGRIFIERS=x"}, envoyDefaults(map[string]string{"statsd": noStatsd})},
		{"dogstatsd", []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "STATSD_HOST=datadog-agent", "STATSD_PORT=8126", "STATSD_PROTOCOL=tcp",
			"USE_DOG_STATSD_MOGRIFIERS=DOMAIN,HITS", "EXTRA_TAGS=cluster:eg", "STATS_FLUSH_INTERVAL=1s", "GOSTATS_FLUSH_INTERVAL_SECONDS=x"}, envoyDefaults(map[string]string{
			"statsd": noStatsd, "dogstatsd": "datadog-agent:8126", "dogstatsd-mogrifiers": "DOMAIN,HITS", "stats-tags": "cluster:eg", "stats-flush": "1s",
		})},
		{"dogstatsd with statistics disabled", []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "DISABLE_STATS=true", "USE_DOG_STATSD_MOGRIFIERS=HITS",
			"USE_PROMETHEUS=true"}, envoyDefaults(map[string]string{"statsd": noStatsd, "prometheus-addr": ":9090", "prometheus-path": "/metrics"})},
		{"what tollgate does anyway", []string{"RUNTIME_WATCH_ROOT=true", "DISABLE_STATS=false", "GOSTATS_LOGGING_SINK_DISABLED=true", "EXPIRATION_JITTER_MAX_SECONDS=60",
			"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true", "REDIS_PIPELINE_LIMIT=8", "REDIS_CLUSTER_PIPELINE_PARALLELISM=0", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true",
			"REDIS_POOL_ON_EMPTY_BEHAVIOR=wait", "REDIS_STARTUP_INITIAL_INTERVAL=2s", "REDIS_STARTUP_MAX_INTERVAL=1m", "REDIS_STARTUP_MAX_ELAPSED_TIME=5m"}, envoyDefaults(nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := tableFlags()
			on, err := applyEnvoyEnv(fs, envOf(tc.env...))
			if err != nil {
				t.Fatalf("applyEnvoyEnv: %v", err)
			}
			if got, want := on, len(tc.want) > 0; got != want {
				t.Errorf("envoy mode = %v, want %v", got, want)
			}
			got := setFlags(fs)
			for name, want := range tc.want {
				if got[name] != want {
					t.Errorf("--%s = %q, want %q", name, got[name], want)
				}
			}
			for name, v := range got {
				if _, ok := tc.want[name]; !ok {
					t.Errorf("--%s = %q, want it left alone", name, v)
				}
			}
		})
	}
}

func TestEnvoyEnvRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  []string
		want []string // in the error
	}{
		{[]string{"USE_PROMETHEUS=true"}, []string{"USE_STATSD", "USE_PROMETHEUS=true", "USE_STATSD=false"}}, // USE_STATSD's default is true
		{[]string{"USE_STATSD=true", "USE_PROMETHEUS=true", "PROMETHEUS_MAPPER_YAML=/m.yaml"}, []string{"USE_STATSD", "USE_PROMETHEUS=true"}},
		{[]string{"STATSD_PORT=statsd"}, []string{`STATSD_PORT="statsd"`}},
		{[]string{"USE_STATSD=maybe"}, []string{`USE_STATSD="maybe"`}},
		{[]string{"GOSTATS_FLUSH_INTERVAL_SECONDS=5s"}, []string{`GOSTATS_FLUSH_INTERVAL_SECONDS="5s"`}},
		{[]string{"STATS_FLUSH_INTERVAL=soon"}, []string{`STATS_FLUSH_INTERVAL="soon"`}},
		{[]string{"EXTRA_TAGS=a"}, []string{`EXTRA_TAGS="a"`, "name:value"}},
		{[]string{"USE_DOG_STATSD=true"}, []string{"USE_STATSD (true by default) and USE_DOG_STATSD=true", "USE_STATSD=false"}},
		{[]string{"USE_DOG_STATSD=true", "USE_STATSD=false", "USE_PROMETHEUS=true"}, []string{"USE_DOG_STATSD=true and USE_PROMETHEUS=true"}},
		{[]string{"USE_DOG_STATSD=maybe", "USE_STATSD=false"}, []string{`USE_DOG_STATSD="maybe"`}},
		{[]string{"USE_DOG_STATSD=true", "USE_STATSD=false", "STATSD_PORT=dogstatsd"}, []string{`STATSD_PORT="dogstatsd"`}},
		{[]string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=mc:11211"}, []string{`BACKEND_TYPE="memcache"`, "MEMCACHE_HOST_PORT=", "REDIS_URL"}},
		{[]string{"CONFIG_TYPE=grpc_xds_delta"}, []string{`CONFIG_TYPE="grpc_xds_delta"`, "FILE or GRPC_XDS_SOTW"}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"}, []string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=", "/readyz"}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=soon"}, []string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL="}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=soon"}, []string{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL="}},
		{[]string{"REDIS_PERSECOND=true", "REDIS_PERSECOND_URL=r2:6379"}, []string{"REDIS_PERSECOND=", "REDIS_PERSECOND_URL (value not shown)"}},
		{[]string{"GRPC_UDS=/tmp/rl.sock"}, []string{"GRPC_UDS=", "GRPC_PORT"}},
		{[]string{"GRPC_MAX_CONNECTION_AGE=1h"}, []string{"GRPC_MAX_CONNECTION_AGE=", "--grpc-max-connection-idle"}},
		{[]string{"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true"}, []string{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS="}},
		{[]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}, []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT="}},
		{[]string{"REDIS_POOL_ON_EMPTY_BEHAVIOR=CREATE"}, []string{"REDIS_POOL_ON_EMPTY_BEHAVIOR=", "REDIS_POOL_SIZE"}},
		{[]string{"REDIS_URL=/var/run/nutcracker/ratelimit.sock"}, []string{"REDIS_SOCKET_TYPE=", "tcp"}},
		{[]string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=/tmp/redis.sock"}, []string{`REDIS_SOCKET_TYPE="unix"`}},
		{[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=ring", "REDIS_URL=r:6379"}, []string{`REDIS_TYPE="ring"`}},
		{[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=sentinel", "REDIS_URL=r:6379"}, []string{"REDIS_URL (value not shown)", "master-name"}},
		{[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r"}, []string{"REDIS_URL (value not shown)", "it is no host:port"}},
		{[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=cluster", "REDIS_URL=a:1,b"}, []string{"REDIS_URL (value not shown)", "part 2 of 2 (comma-separated) is no host:port"}},
		{[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=u:pw@r:6379"}, []string{"REDIS_URL (value not shown)", "a password goes in REDIS_AUTH"}},
		{[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:1", "REDIS_POOL_SIZE=many"}, []string{"REDIS_POOL_SIZE="}},
		{[]string{"PORT=http"}, []string{`PORT="http"`}},
		{[]string{"LOG_LEVEL=loud"}, []string{`LOG_LEVEL="loud"`}},
		{[]string{"LIMIT_RESPONSE_HEADERS_ENABLED=yes"}, []string{"LIMIT_RESPONSE_HEADERS_ENABLED="}},
		{[]string{"RUNTIME_WATCH_ROOT=sometimes"}, []string{"RUNTIME_WATCH_ROOT="}},
		{[]string{"GRPC_SERVER_USE_TLS=true"}, []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_KEY"}},
	} {
		t.Run(strings.Join(tc.env, " "), func(t *testing.T) {
			t.Parallel()
			_, err := applyEnvoyEnv(tableFlags(), envOf(tc.env...))
			if err == nil {
				t.Fatalf("applyEnvoyEnv: no error, want one naming %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// serveFlagNames returns the names of serve's real flags, as its usage
// lists them.
func serveFlagNames(t *testing.T) []string {
	t.Helper()
	var out bytes.Buffer
	if _, code, ok := parseServe([]string{"-h"}, envOf(), &out); ok || code != 0 {
		t.Fatalf("serve -h: ok %v, exit %d", ok, code)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(out.String(), -1) {
		names = append(names, m[1])
	}
	if len(names) < 20 {
		t.Fatalf("serve -h lists %d flags:\n%s", len(names), out.String())
	}
	return names
}

// TestEnvoyEnvFlagsExist checks that every flag the table sets is one of
// serve's. A flag missing here is either not yet in serve or misnamed in
// envoyVars (or envoyModeFlags).
func TestEnvoyEnvFlagsExist(t *testing.T) {
	t.Parallel()
	have := serveFlagNames(t)
	var missing []string
	for _, name := range envoyFlagNames() {
		if !slices.Contains(have, name) {
			missing = append(missing, "--"+name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("envoyVars names flags serve does not have: %s", strings.Join(missing, " "))
	}
}

// TestEnvoyEnvTable checks the table itself: each variable once, every
// honoured one with a flag, every refused one with advice, and each in
// docs/envoy-environment.md.
func TestEnvoyEnvTable(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/envoy-environment.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, v := range envoyVars {
		if seen[v.name] {
			t.Errorf("%s: twice in envoyVars", v.name)
		}
		seen[v.name] = true
		if got, want := v.flag != "", v.kind == envoyHonoured; got != want {
			t.Errorf("%s: has a flag %v, want %v (honoured and only honoured variables have one)", v.name, got, want)
		}
		if v.note == "" {
			t.Errorf("%s: no note", v.name)
		}
		if !bytes.Contains(doc, []byte("`"+v.name+"`")) {
			t.Errorf("%s: not in docs/envoy-environment.md", v.name)
		}
	}
}

func TestParseServeEnvoyFlagWins(t *testing.T) {
	t.Parallel()
	getenv := envOf("HOST=127.0.0.1", "PORT=9000", "RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=rl", "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	for _, tc := range []struct {
		args                            []string
		wantHTTP, wantConfig, wantHeads string
	}{
		{nil, "127.0.0.1:9000", "/data/rl/config", "ratelimit"},
		{[]string{"--http", "127.0.0.1:7000", "--config", "rules.yaml", "--headers", "draft"}, "127.0.0.1:7000", "rules.yaml", "draft"},
	} {
		o, code, ok := parseServe(tc.args, getenv, io.Discard)
		if !ok {
			t.Fatalf("%v: exit %d", tc.args, code)
		}
		if got, want := o.httpAddr, tc.wantHTTP; got != want {
			t.Errorf("%v: --http %q, want %q", tc.args, got, want)
		}
		if got, want := o.f.config, tc.wantConfig; got != want {
			t.Errorf("%v: --config %q, want %q", tc.args, got, want)
		}
		if got, want := o.f.headers, tc.wantHeads; got != want {
			t.Errorf("%v: --headers %q, want %q", tc.args, got, want)
		}
	}
}

func TestEnvoyRedisEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"PORT=8080", "REDIS_AUTH=app:pw:with:colons"}, "pw:with:colons"},
		{[]string{"PORT=8080", "REDIS_AUTH=pw"}, "pw"},
		// Outside envoy mode REDIS_AUTH is the password, colons and all.
		{[]string{"REDIS_AUTH=app:pw"}, "app:pw"},
	} {
		if got := envoyRedisEnv(envOf(tc.env...))("REDIS_AUTH"); got != tc.want {
			t.Errorf("%v: REDIS_AUTH read as %q, want %q", tc.env, got, tc.want)
		}
	}
}

// runtimeTree writes rules as envoyproxy/ratelimit's runtime expects them,
// ROOT/ratelimit/config/config.yaml, and returns ROOT.
func runtimeTree(t *testing.T, rules string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "config.yaml"), rules)
	return root
}

const envoyEnvRules = `domain: rl
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
`

// startEnv runs tollgate serve with no environment but env, and args, and
// waits until it listens.
func startEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := spawnEnv(t, env, args...)
	p.awaitListening(grpc.WithTransportCredentials(insecure.NewCredentials()))
	return p
}

// spawnEnv runs tollgate serve with no environment but env, and args.
func spawnEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return spawnCmd(t, exec.Command(tollgateBinary(t), append([]string{"serve"}, args...)...), env)
}

// spawnCmd runs cmd, tollgate, with no environment but env.
func spawnCmd(t *testing.T, cmd *exec.Cmd, env []string) *proc {
	t.Helper()
	cmd.Env = env
	p := &proc{t: t, cmd: cmd, log: &logBuffer{added: make(chan struct{}, 1)}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("tollgate log:\n%s", p.log.String())
		}
	})
	return p
}

// awaitListening waits until p listens, and dials its gRPC address with
// opts, its credentials among them.
func (p *proc) awaitListening(opts ...grpc.DialOption) {
	p.t.Helper()
	m := p.log.waitFor(p.t, listening, 20*time.Second)
	p.http, p.grpc = "http://"+m[1], m[3]
	conn, err := grpc.NewClient(p.grpc, opts...)
	if err != nil {
		p.t.Fatal(err)
	}
	p.conn, p.rls = conn, pb.NewRateLimitServiceClient(conn)
}

// composeEnv is envoyproxy/ratelimit's docker-compose example environment
// for a Redis at addr and rules under root, on loopback ports the kernel
// picks (PORT=0 and so on).
func composeEnv(addr, root string, more ...string) []string {
	return append([]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + addr, "RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false", "USE_STATSD=false", "HOST=127.0.0.1", "PORT=0",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0"}, more...)
}

// TestServeEnvoyEnvironment runs tollgate serve with nothing but
// envoyproxy/ratelimit's environment, against a real Redis, and asks it
// over gRPC and /json with the rules of the runtime directory.
func TestServeEnvoyEnvironment(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	p := startEnv(t, composeEnv(rdb.Addr(), runtimeTree(t, envoyEnvRules)))
	user := "u-" + randomID()

	for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
		r := p.ask(request("rl", desc("user", user)))
		if got := codesOf(r); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
		if len(r.ResponseHeadersToAdd) != 0 {
			t.Errorf("request %d: headers %v, want none (LIMIT_RESPONSE_HEADERS_ENABLED is false)", i+1, headersOf(r))
		}
	}
	body := `{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"` + user + `"}]}]}`
	code, out := postJSON(t, p.http+"/json", body)
	if code != http.StatusTooManyRequests || !strings.Contains(out, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("/json: %d %s, want 429 and OVER_LIMIT", code, out)
	}
	resp, err := http.Post(p.http+"/json", "application/json", strings.NewReader(strings.Replace(body, user, user+"-2", 1)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/json for another user: %d, want 200", resp.StatusCode)
	}
	for _, h := range []string{"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "X-RateLimit-Limit"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("/json: %s: %s, want no rate-limit header", h, v)
		}
	}
	log := p.log.String()
	if want := `read=HOST,PORT,GRPC_HOST,GRPC_PORT,DEBUG_HOST,DEBUG_PORT,RUNTIME_ROOT,RUNTIME_SUBDIRECTORY,RUNTIME_APPDIRECTORY,RUNTIME_WATCH_ROOT,USE_STATSD,REDIS_SOCKET_TYPE,REDIS_URL unused_as_in_envoy=""`; !strings.Contains(log, want) {
		t.Errorf("the log does not say which variables were read (%s):\n%s", want, log)
	}
	if !strings.Contains(log, "store=redis") {
		t.Errorf("not deciding with Redis:\n%s", log)
	}
	dbg := p.log.waitFor(t, regexp.MustCompile(`msg="debug listening" addr=(\S+)`), 5*time.Second)
	if code, _ := getURL(t, "http://"+dbg[1]+"/debug/pprof/"); code != http.StatusOK {
		t.Errorf("debug listener (DEBUG_HOST:DEBUG_PORT): %d, want 200", code)
	}
}

// getURL GETs url and returns the status and body.
func getURL(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeEnvoyEnvironmentExtras runs envoy's Prometheus listener, its
// local cache and a REDIS_AUTH of "user:password" against a Redis whose
// user needs that password.
func TestServeEnvoyEnvironmentExtras(t *testing.T) {
	t.Parallel()
	tollgateBinary(t) // built first: the deadline below is the test's
	rdb := redistest.NewServer(t)
	rc := rdb.Client(t)
	// Starting the binary may take a while on a busy machine: the Redis
	// calls get their own deadlines, not one shared with the start.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rc.Do(ctx, "ACL", "SETUSER", "app", "on", ">"+secret, "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	p := startEnv(t, composeEnv(rdb.Addr(), runtimeTree(t, envoyEnvRules),
		"REDIS_AUTH=app:"+secret, "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0", "PROMETHEUS_PATH=/prom",
		"LOCAL_CACHE_SIZE_IN_BYTES=1000000"))
	user := "u-" + randomID()
	scripts := func() int {
		t.Helper()
		info, err := rc.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range regexp.MustCompile(`cmdstat_(?:evalsha|eval|fcall|fcall_ro):calls=(\d+)`).FindAllStringSubmatch(info, -1) {
			c, _ := strconv.Atoi(m[1])
			n += c
		}
		return n
	}
	for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
		if got := codesOf(p.ask(request("rl", desc("user", user)))); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
	}
	before := scripts()
	for i := range 5 {
		if got, want := codesOf(p.ask(request("rl", desc("user", user)))), "OVER_LIMIT: OVER_LIMIT"; got != want {
			t.Errorf("denied request %d: %s, want %s", i+1, got, want)
		}
	}
	if got := scripts() - before; got != 0 {
		t.Errorf("5 denials of a key over its limit ran %d Redis scripts, want 0 (the local cache answers them)", got)
	}
	m := p.log.waitFor(t, regexp.MustCompile(`msg="prometheus listening" addr=(\S+) path=/prom`), 5*time.Second)
	code, body := getURL(t, "http://"+m[1]+"/prom")
	if code != http.StatusOK || !strings.Contains(body, "tollgate_serve_requests_total") {
		t.Errorf("PROMETHEUS_ADDR/PROMETHEUS_PATH: %d, want 200 and tollgate's metrics:\n%.500s", code, body)
	}
	if strings.Contains(p.log.String(), "M4RK") {
		t.Errorf("the log shows the password:\n%s", p.log.String())
	}
}

// TestServeEnvoyEnvironmentRefused starts tollgate serve with a variable
// that asks for what tollgate does not do: it stops at once, naming it.
func TestServeEnvoyEnvironmentRefused(t *testing.T) {
	t.Parallel()
	root := runtimeTree(t, envoyEnvRules)
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"USE_STATSD=true", "USE_PROMETHEUS=true"}, "USE_STATSD (true by default) and USE_PROMETHEUS=true"},
		{[]string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=127.0.0.1:11211"}, `BACKEND_TYPE="memcache"`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			env := append(composeEnv("127.0.0.1:1", root), tc.env...)
			bin := tollgateBinary(t) // built first: the deadline is the run's
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "serve")
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output does not name %s:\n%s", tc.want, out)
			}
		})
	}
}

// TestServeEnvoyEnvironmentFlagWins starts tollgate with envoy's
// environment and flags that say otherwise: the flags win.
func TestServeEnvoyEnvironmentFlagWins(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	// RUNTIME_ROOT names a directory that does not exist: --config must win
	// for the service to start at all.
	rules := filepath.Join(runtimeTree(t, envoyEnvRules), "ratelimit", "config")
	env := composeEnv(rdb.Addr(), "/nonexistent", "LIMIT_RESPONSE_HEADERS_ENABLED=false")
	p := startEnv(t, env, "--config", rules, "--headers", "ratelimit")
	r := p.ask(request("rl", desc("user", "u-"+randomID())))
	if got, want := codesOf(r), "OK: OK"; got != want {
		t.Errorf("%s, want %s", got, want)
	}
	if got := headersOf(r)["RateLimit-Limit"]; got != "2" {
		t.Errorf("RateLimit-Limit %q, want 2 (--headers ratelimit over LIMIT_RESPONSE_HEADERS_ENABLED=false)", got)
	}
}

// TestServeEnvoyEnvironmentRedisTypes runs tollgate serve with envoy's
// REDIS_TYPE SENTINEL and CLUSTER against real deployments, their
// addresses written as envoy writes them.
func TestServeEnvoyEnvironmentRedisTypes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) string // REDIS_URL
	}{
		{"SENTINEL", func(t *testing.T) string {
			s := redistest.NewSentinel(t, 1)
			return strings.Join(append([]string{redistest.SentinelMasterName}, s.SentinelAddrs()...), ",")
		}},
		{"cluster", func(t *testing.T) string {
			return strings.Join(redistest.NewCluster(t, 3, 0).Addrs(), ",")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := composeEnv(tc.start(t), runtimeTree(t, envoyEnvRules), "REDIS_TYPE="+tc.name)
			// A deadline a loaded machine keeps: what is tested is the
			// topology, not the default 50 ms, which a stalled call on a
			// busy machine missed once (the request failed open).
			p := startEnv(t, env, "--timeout", "5s")
			if !p.readyWithin(15 * time.Second) {
				t.Fatalf("not ready: Redis unreachable through %v", env)
			}
			user := "u-" + randomID()
			for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
				if got := codesOf(p.ask(request("rl", desc("user", user)))); got != want {
					t.Errorf("request %d: %s, want %s", i+1, got, want)
				}
			}
			if !strings.Contains(p.log.String(), "store=redis") {
				t.Errorf("not deciding with Redis")
			}
		})
	}
}
