package server

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/redistest"
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
	store := redisstore.New(client, redisstore.WithPrefix("pipelined-test:"), redisstore.WithPipeline(50*time.Microsecond, 64))
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
	rules, err := config.Parse("r.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: closed\n    rate_limit: {unit: hour, requests_per_unit: 100, failure_mode: closed}\n"))
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
	}
}
