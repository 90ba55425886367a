package service

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/store/redisurl"
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
	client, err := redisurl.NewClient(rdb.URL())
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
