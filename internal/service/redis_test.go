package service

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/redisstore"
)

// TestPipelinedRedis decides concurrently through a pipelined redisstore on
// a real Redis, as tollgate serve does: a limit is exact, and a paused Redis
// cannot hold a caller past its deadline.
func TestPipelinedRedis(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	client, err := NewRedisClient(rdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	store := redisstore.New(client, redisstore.WithPrefix(testkit.KeyPrefix(t)), redisstore.WithPipeline(50*time.Microsecond, 64))
	// A generous deadline while counting: on a loaded machine a decision
	// that missed a short one would be answered by failure mode, not
	// counted. The short deadline is checked below, with Redis paused.
	s, err := New(store, WithTimeout(5*time.Second), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	short, err := New(store, WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := config.Parse("r.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: closed\n    rate_limit: {unit: hour, requests_per_unit: 100, failure_mode: closed}\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 100, failure_mode: closed}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(rules)
	short.SetRules(rules)

	var ok atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				r, err := s.ShouldRateLimit(context.Background(), req("d", entries("k", "exact")))
				if err != nil {
					t.Error(err)
					return
				}
				if r.OverallCode == pb.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got, want := ok.Load(), int64(100); got != want {
		t.Errorf("%d of 320 concurrent requests allowed, want exactly %d", got, want)
	}

	if err := rdb.Pause(); err != nil {
		t.Fatal(err)
	}
	defer rdb.Resume()
	for range 3 {
		start := time.Now()
		r := ask(t, short, req("d", entries("closed", "x")))
		// 100 ms deadline; the bound leaves room for a loaded machine and
		// is far below go-redis's own 3 s read timeout.
		if took := time.Since(start); took > time.Second {
			t.Errorf("paused Redis: answered in %v", took)
		}
		if got, want := codesOf(r), "OVER_LIMIT: OVER_LIMIT"; got != want {
			t.Errorf("paused Redis, failure_mode closed: %s, want %s", got, want)
		}
		// A shadow rule never blocks, not even when it fails closed.
		if got, want := codesOf(ask(t, short, req("d", entries("shadow", "x")))), "OK: OK"; got != want {
			t.Errorf("paused Redis, shadow rule failing closed: %s, want %s", got, want)
		}
	}
}

// marker is in every password below; no error may contain it, in any
// spelling.
const marker = "s3cr3t-M4RK"

// TestRedisURLErrorsHideCredentials drives every error path of the URL
// parser — ours and go-redis's — with a password holding marker, in every
// place a URL can carry one.
func TestRedisURLErrorsHideCredentials(t *testing.T) {
	t.Parallel()
	pw := marker + "%21x" // %-escaped: "s3cr3t-M4RK!x" once decoded
	for _, tc := range []struct {
		name, url string
	}{
		{"no scheme", "user:" + pw + "@127.0.0.1:6379"},
		{"no scheme, no user", ":" + pw + "@127.0.0.1:6379"},
		{"unknown scheme", "http://:" + pw + "@127.0.0.1:6379"},
		{"unknown deployment", "redis+ring://:" + pw + "@127.0.0.1:6379"},
		{"bad port", "redis://:" + pw + "@127.0.0.1:port"},
		{"bad escape in password", "redis://:" + marker + "%zz@127.0.0.1:6379"},
		{"password with a slash", "redis://:" + marker + "/x@127.0.0.1:6379/0"},
		{"password with a question mark", "redis://:" + marker + "?x@127.0.0.1:6379?dial_timeout=x"},
		{"password without a colon", "redis://" + pw + "@127.0.0.1:6379/x"},
		{"bad database", "redis://:" + pw + "@127.0.0.1:6379/abc"},
		{"bad path", "redis://:" + pw + "@127.0.0.1:6379/1/2"},
		{"bad option", "redis://:" + pw + "@127.0.0.1:6379?dial_timeout=soon"},
		{"unknown option", "redis://:" + pw + "@127.0.0.1:6379?frobnicate=1"},
		{"password option on one server", "redis://127.0.0.1:6379?password=" + pw},
		{"sentinel without master", "redis+sentinel://:" + pw + "@127.0.0.1:26379?password=" + pw},
		{"sentinel password option", "redis+sentinel://127.0.0.1:26379?master_name=m&password=" + pw + "&dial_timeout=soon"},
		{"sentinel_password option", "redis+sentinel://127.0.0.1:26379?master_name=m&sentinel_password=" + pw},
		{"sentinel bad bool", "redis+sentinel://127.0.0.1:26379?master_name=m&password=" + pw + "&replica_only=" + pw},
		{"sentinel bad addr", "redis+sentinel://:" + pw + "@127.0.0.1:26379?master_name=m&addr=" + pw},
		{"cluster bad option", "redis+cluster://:" + pw + "@127.0.0.1:7000?read_only=maybe"},
		{"cluster bad addr", "redis+cluster://u:" + pw + "@127.0.0.1:7000?addr=nohost"},
		{"cluster password option", "redis+cluster://127.0.0.1:7000?password=" + pw},
		{"tls cluster, bad number", "rediss+cluster://:" + pw + "@127.0.0.1:7000?max_redirects=" + pw},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := NewRedisClient(tc.url)
			if err == nil {
				c.Close()
				t.Fatalf("NewRedisClient(%q): no error", tc.url)
			}
			if got := err.Error(); strings.Contains(got, marker) || strings.Contains(got, "M4RK") {
				t.Errorf("error shows the password: %s", got)
			}
			if !strings.HasPrefix(err.Error(), "server: redis URL") {
				t.Errorf("error %q: want it to start with %q", err, "server: redis URL")
			}
		})
	}
}

// TestRedactor checks the spellings a credential can take in text:
// go-redis's and net/url's messages quote, escape and decode.
func TestRedactor(t *testing.T) {
	t.Parallel()
	r := NewRedactor("redis+sentinel://sentinel:"+marker+"-a%40b@h:26379?master_name=m&password="+marker+"-c&sentinel_password="+marker+"-d", marker+"-file\"q")
	for _, text := range []string{
		marker + "-a%40b", marker + "-a@b", marker + "-c", marker + "-d", marker + "-file\"q",
		strconv.Quote(marker + "-file\"q"), `parse "redis://sentinel:` + marker + `-a%40b@h": invalid port`,
	} {
		if got := r.Redact(text); strings.Contains(got, "M4RK") {
			t.Errorf("Redact(%q) = %q", text, got)
		}
	}
	if got, want := r.Redact("dial tcp 127.0.0.1:26379: connect: connection refused"), "dial tcp 127.0.0.1:26379: connect: connection refused"; got != want {
		t.Errorf("Redact changed text without secrets: %q, want %q", got, want)
	}
}

// TestRedisPasswordOption connects to a real redis-server that requires a
// password: WithRedisPassword replaces a URL's wrong one, and a wrong
// password's error does not show it.
func TestRedisPasswordOption(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Set after start: redistest checks the server with a PING of its own.
	if err := rdb.Client(t).ConfigSet(ctx, "requirepass", marker+"-right").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		url  string
		opts []RedisOption
		ok   bool
	}{
		{"password in URL", "redis://:" + marker + "-right@" + rdb.Addr(), nil, true},
		{"option replaces the URL's", "redis://:" + marker + "-wrong@" + rdb.Addr(), []RedisOption{WithRedisPassword(marker + "-right")}, true},
		{"option alone", "redis://" + rdb.Addr(), []RedisOption{WithRedisPassword(marker + "-right")}, true},
		{"wrong option", "redis://:" + marker + "-right@" + rdb.Addr(), []RedisOption{WithRedisPassword(marker + "-wrong")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewRedisClient(tc.url, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = c.Ping(ctx).Err()
			if got, want := err == nil, tc.ok; got != want {
				t.Fatalf("PING: %v, want success %v", err, want)
			}
			if err != nil && strings.Contains(err.Error(), marker) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}

// TestParallelDescriptors: a request's descriptors decided at once on a
// real Redis spend exactly as one after another would, and with Redis
// paused the request still counts one timeout.
func TestParallelDescriptors(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	client := rdb.Client(t)
	store := redisstore.New(client, redisstore.WithPrefix(testkit.KeyPrefix(t)), redisstore.WithPipeline(50*time.Microsecond, 64))
	rules, err := config.Parse("r.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	newServer := func(timeout time.Duration) *Server {
		s, err := New(store, WithParallelDescriptors(true), WithTimeout(timeout), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		s.SetRules(rules)
		return s
	}
	s := newServer(5 * time.Second)
	r := req("d", entries("k", "x"), entries("k", "x"), entries("k", "y"))
	var gotX, gotY int
	for range 2 {
		resp := ask(t, s, r)
		for i, st := range resp.Statuses {
			if st.Code != pb.RateLimitResponse_OK {
				continue
			}
			if i < 2 {
				gotX++
			} else {
				gotY++
			}
		}
	}
	// x: 4 hits of a limit of 3; y: 2.
	if gotX != 3 || gotY != 2 {
		t.Errorf("admitted x %d, y %d; want 3 and 2", gotX, gotY)
	}

	short := newServer(100 * time.Millisecond)
	if err := rdb.Pause(); err != nil {
		t.Fatal(err)
	}
	defer rdb.Resume()
	before := testutil.ToFloat64(short.m.storeErrors[0])
	if got, want := codesOf(ask(t, short, req("d", entries("k", "p"), entries("k", "q"), entries("k", "r")))), "OK: OK OK OK"; got != want {
		t.Errorf("paused Redis, failing open: %s, want %s", got, want)
	}
	if got := testutil.ToFloat64(short.m.storeErrors[0]) - before; got != 1 {
		t.Errorf("%v timeouts counted for one request, want 1", got)
	}
}
