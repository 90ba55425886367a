package main

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// TestStatsRedisPool: envoy's statistics of its Redis pool,
// ratelimit.redis_pool.{cx_active,cx_total,cx_local_close}, through
// Envoy Gateway v1.3's mapping, which passes them through (its earlier
// mapping drops them). Redis closing every client connection makes the
// pool close its own and open new ones. The requests' deadline is 5 s:
// a call past the default 50 ms, on a busy machine, would close its
// connection before the test does.
func TestStatsRedisPool(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	root := runtimeTree(t, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n")
	p := startEnv(t, statsEnv(root, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+rdb.Addr(), "USE_STATSD=false", "USE_PROMETHEUS=true",
		"PROMETHEUS_ADDR=127.0.0.1:0", "PROMETHEUS_MAPPER_YAML="+egMappingV13), "--timeout", "5s")
	url := "http://" + p.log.waitFor(t, regexp.MustCompile(`msg="prometheus listening" addr=(\S+)`), 5*time.Second)[1] + "/metrics"
	pool := regexp.MustCompile(`^ratelimit_redis_pool_`)
	traffic := func() {
		for range 20 {
			p.ask(request("d", desc("user", randomID())))
		}
	}
	traffic()
	first := waitFor(t, url, pool, "connections open and opened", func(m map[string]float64) bool {
		return m["ratelimit_redis_pool_cx_active"] >= 1 && m["ratelimit_redis_pool_cx_total"] >= m["ratelimit_redis_pool_cx_active"]
	})
	if got := first["ratelimit_redis_pool_cx_local_close"]; got != 0 {
		t.Errorf("cx_local_close = %v before any connection closed", got)
	}

	c := rdb.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, url, pool, "the killed connections closed and new ones opened", func(m map[string]float64) bool {
		traffic()
		return m["ratelimit_redis_pool_cx_local_close"] >= 1 && m["ratelimit_redis_pool_cx_total"] > first["ratelimit_redis_pool_cx_total"] &&
			m["ratelimit_redis_pool_cx_active"] == m["ratelimit_redis_pool_cx_total"]-m["ratelimit_redis_pool_cx_local_close"]
	})
}

// waitFor scrapes the series at url matching re until ok says they are
// what is wanted, and returns them.
func waitFor(t *testing.T, url string, re *regexp.Regexp, what string, ok func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		m := scrape(t, url, re)
		if ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 15s: %v", what, m)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
