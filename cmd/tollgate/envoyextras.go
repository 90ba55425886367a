package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/tiered"
)

// envoyExtras are the flags serve has for envoy's variables that no other
// part of tollgate needed: a Prometheus listener of its own and the local
// cache of denials.
type envoyExtras struct {
	promAddr, promPath string
	localCacheBytes    int
	stats              statsFlags // stats.go
}

func (x *envoyExtras) register(fs *flag.FlagSet) {
	fs.StringVar(&x.promAddr, "prometheus-addr", "", "also serve the Prometheus metrics on this address, alone (envoy's USE_PROMETHEUS and PROMETHEUS_ADDR); they are always on the HTTP listener's /metrics")
	fs.StringVar(&x.promPath, "prometheus-path", "/metrics", "the path of the metrics on --prometheus-addr")
	x.stats.register(fs)
	fs.IntVar(&x.localCacheBytes, "local-cache-bytes", 0, "with Redis: remember keys over their limit in about this many bytes of memory and deny them locally, without a Redis call, until they could pass (envoy's LOCAL_CACHE_SIZE_IN_BYTES); 0 remembers none")
}

func (x *envoyExtras) check() error {
	if x.localCacheBytes < 0 {
		return fmt.Errorf("--local-cache-bytes %d: want 0 or more", x.localCacheBytes)
	}
	if !strings.HasPrefix(x.promPath, "/") {
		return fmt.Errorf("--prometheus-path %q: want a path starting with /", x.promPath)
	}
	return x.stats.check()
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
// while Redis is down, and sets no deadline beyond --timeout. The service
// never refunds what a request spent (a stream's settle only charges
// more), which is what tiered's denial cache needs to be exact.
func (x *envoyExtras) withLocalCache(rs tollgate.Store, log *slog.Logger) tollgate.Store {
	if x.localCacheBytes <= 0 {
		return rs
	}
	log.Info("local cache of denials in front of Redis", "bytes", x.localCacheBytes, "keys", localCacheKeys(x.localCacheBytes))
	return tiered.New(rs, tiered.WithMaxKeys(localCacheKeys(x.localCacheBytes)), tiered.WithoutDegradedMode(),
		tiered.WithTimeout(0), tiered.WithLogger(log), tiered.WithDenialCache())
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
