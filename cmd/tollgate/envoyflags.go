package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strconv"
	"strings"
	"time"
)

// envoyModeOn reports whether envoy's environment is in use: whether any
// of its variables is set, but for those tollgate reads with the same
// meaning outside envoy mode (REDIS_URL as a URL, REDIS_AUTH, the xDS
// stream's headers) and for OpenTelemetry's own.
func envoyModeOn(getenv env) bool {
	for _, v := range envoyVars {
		val := getenv(v.name)
		switch {
		case val == "", v.name == "REDIS_AUTH", v.name == xdsHeadersVar, strings.HasPrefix(v.name, "OTEL_"):
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
		if !fileOn(e) {
			return "", false, nil
		}
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
	"statsd": envoyStatsd,
	"dogstatsd": func(e envoyEnv) (string, bool, error) {
		on, err := e.boolean("USE_DOG_STATSD")
		if err != nil || !on || e.isTrue("DISABLE_STATS") || e.isTrue("USE_STATSD") {
			return "", false, err // with USE_STATSD, envoyStatsd refuses the two
		}
		if prometheusOn(e) {
			return "", false, errors.New("USE_DOG_STATSD=true and USE_PROMETHEUS=true: envoyproxy/ratelimit refuses the two together, as it has one statistics sink; set one")
		}
		return e.hostPort("STATSD_HOST", "STATSD_PORT")
	},
	"prometheus-mapper": func(e envoyEnv) (string, bool, error) {
		off, err := e.boolean("DISABLE_STATS")
		return e.getenv("PROMETHEUS_MAPPER_YAML"), !off && prometheusOn(e) && e.set("PROMETHEUS_MAPPER_YAML"), err
	},
	"ignore-dotfiles": func(e envoyEnv) (string, bool, error) {
		if !fileOn(e) {
			return "", false, nil
		}
		b, err := e.boolean("RUNTIME_IGNOREDOTFILES")
		return strconv.FormatBool(b), true, err
	},
	"xds": func(e envoyEnv) (string, bool, error) {
		switch t := e.get("CONFIG_TYPE"); {
		case fileOn(e):
			return "", false, nil
		case xdsOn(e):
			return e.get("CONFIG_GRPC_XDS_SERVER_URL"), true, nil
		default:
			return "", false, envoyErrorf("CONFIG_TYPE", t, "want FILE or GRPC_XDS_SOTW")
		}
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
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": envoyDuration,
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL":     envoyDuration,
	"STATS_FLUSH_INTERVAL": func(v string) (string, error) {
		if n, err := strconv.Atoi(v); err == nil {
			return strconv.Itoa(n) + "ns", nil // envoy's settings read a bare number as nanoseconds
		}
		return v, checkDuration(v)
	},
	"EXTRA_TAGS": func(v string) (string, error) {
		if _, err := parseTags(v); err != nil {
			return "", errors.New("want name:value,name:value")
		}
		return v, nil
	},
	"LOG_FORMAT": func(v string) (string, error) {
		if strings.EqualFold(v, "json") {
			return "json", nil
		}
		return "text", nil
	},
}

// envoyDuration spells a duration of envoy's, a Go duration or a whole
// number of nanoseconds, as Go's flag reads it.
func envoyDuration(v string) (string, error) {
	if _, err := time.ParseDuration(v); err == nil {
		return v, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return strconv.FormatInt(n, 10) + "ns", nil
	}
	return "", errors.New("want a duration such as 10s")
}

// envoyStatsd is --statsd: STATSD_HOST:STATSD_PORT while USE_STATSD is true
// (its default) and DISABLE_STATS is not. envoy refuses statsd with
// Prometheus or DogStatsD (it has one statistics sink), and so does
// tollgate.
func envoyStatsd(e envoyEnv) (string, bool, error) {
	on, err := e.boolean("USE_STATSD")
	if err != nil {
		return "", false, err
	}
	off, err := e.boolean("DISABLE_STATS")
	if err != nil || off || !on {
		return "", false, err
	}
	if prometheusOn(e) {
		return "", false, errors.New("USE_STATSD (true by default) and USE_PROMETHEUS=true: envoyproxy/ratelimit refuses the two together, as it has one statistics sink; set USE_STATSD=false")
	}
	if dogStatsdOn(e) {
		return "", false, errors.New("USE_STATSD (true by default) and USE_DOG_STATSD=true: envoyproxy/ratelimit refuses the two together, as it has one statistics sink; set USE_STATSD=false")
	}
	return e.hostPort("STATSD_HOST", "STATSD_PORT")
}

// hostPort joins two listener variables into an address.
func (e envoyEnv) hostPort(host, port string) (string, bool, error) {
	p := e.get(port)
	if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
		return "", false, envoyErrorf(port, p, "want a port number")
	}
	return net.JoinHostPort(e.get(host), p), true, nil
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
				errs = append(errs, envoyErrorf(v.name, e.getenv(v.name), "this tollgate has no --%s flag to carry it", v.flag))
			}
			continue // envoy's default, for a flag this build lacks
		}
		if err := fs.Set(v.flag, val); err != nil {
			errs = append(errs, envoyErrorf(v.name, getenv(v.name), "--%s: %v", v.flag, err))
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
				return envoyErrorf(v.name, val, "%v", err)
			}
		}
	case envoyRefused:
		accepted := v.def
		if v.off != "" {
			accepted = v.off
		}
		if !sameSetting(accepted, val) {
			return envoyErrorf(v.name, val, "%s", v.note)
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
			return "", false, envoyErrorf(v.name, val, "%v", err)
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
