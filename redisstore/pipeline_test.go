package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/redisstore"
)

// pipelined is backend with WithPipeline: the same table must pass, one
// decision at a time (each waits out the window alone).
func pipelined(client func(*testing.T) redis.UniversalClient) conformance.Backend {
	b := backend(client)
	b.New = func(t *testing.T, now func() time.Time) tollgate.Store {
		return redisstore.New(client(t), redisstore.WithClock(now), redisstore.WithPipeline(20*time.Microsecond, 16))
	}
	return b
}

func TestPipelineConformance(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) { t.Parallel(); conformance.Run(t, pipelined(standalone)) })
	t.Run("cluster", func(t *testing.T) { t.Parallel(); conformance.Run(t, pipelined(clustered)) })
	t.Run("differential", func(t *testing.T) {
		t.Parallel()
		conformance.Differential(t, pipelined(standalone), conformance.T0, 1000, 5)
	})
}

// TestPipelineConcurrent sends many concurrent decisions on a few keys and
// requires exact counts (no refill within the test: one token an hour) and
// fewer pipelines than decisions. Batched, the decisions take fewer script
// calls than decisions (on a single server, one a pipeline: they are all
// of one algorithm); unbatched, a script call each.
func TestPipelineConcurrent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		client  func(*testing.T) redis.UniversalClient
		batched bool
	}{
		{"standalone", standalone, true},
		{"standalone unbatched", standalone, false},
		{"cluster unbatched", clustered, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := tc.client(t)
			var pipelines, cmds, alone atomic.Int64
			rdb.AddHook(pipeHook{pipelines: &pipelines, cmds: &cmds, alone: &alone})
			s := redisstore.New(rdb, redisstore.WithPipeline(200*time.Microsecond, 32), redisstore.WithBatching(tc.batched))
			ctx := context.Background()
			const goroutines, each, nkeys, burst = 48, 40, 6, 100
			keys := make([]string, nkeys)
			for i := range keys {
				keys[i] = key(t)
			}
			limit := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: time.Hour, Burst: burst}
			var allowed [nkeys]atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						k := (g + i) % nkeys
						res, err := s.AllowN(ctx, keys[k], limit, 1)
						if err != nil {
							t.Error(err)
							return
						}
						if res.Allowed {
							allowed[k].Add(1)
						}
					}
				}()
			}
			wg.Wait()
			for k := range allowed {
				if got, want := allowed[k].Load(), int64(burst); got != want {
					t.Errorf("key %d: %d allowed, want %d", k, got, want)
				}
			}
			decisions := int64(goroutines * each)
			if got := pipelines.Load(); got == 0 || got >= decisions/2 {
				t.Errorf("%d pipelines for %d decisions: want batches of several", got, decisions)
			}
			// A decision made while nothing is in flight is sent alone.
			switch got := cmds.Load() + alone.Load(); {
			case !tc.batched && got < decisions:
				t.Errorf("unbatched: %d commands (%d alone) for %d decisions, want one each", got, alone.Load(), decisions)
			case tc.batched && got >= decisions:
				t.Errorf("batched: %d commands (%d alone) for %d decisions, want fewer", got, alone.Load(), decisions)
			case tc.batched && tc.name == "standalone" && cmds.Load() != pipelines.Load():
				t.Errorf("batched on one server: %d commands in %d pipelines, want one each", cmds.Load(), pipelines.Load())
			}
		})
	}
}

// pipeHook counts the pipelines that carry script or function calls, and
// those calls in them (a new connection's handshake is a pipeline too),
// and, if alone is set, the script or function calls sent on their own
// (and in marked those whose context carries a ctxMark).
type pipeHook struct{ pipelines, cmds, alone, marked *atomic.Int64 }

type ctxMark struct{}

func (h pipeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); h.alone != nil && (name == "evalsha" || name == "eval" || name == "fcall") {
			h.alone.Add(1)
			if h.marked != nil && ctx.Value(ctxMark{}) != nil {
				h.marked.Add(1)
			}
		}
		return next(ctx, cmd)
	}
}
func (h pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var scripts int64
		for _, c := range cmds {
			if name := c.Name(); name == "evalsha" || name == "eval" || name == "fcall" {
				scripts++
			}
		}
		if scripts > 0 {
			h.pipelines.Add(1)
			h.cmds.Add(scripts)
		}
		return next(ctx, cmds)
	}
}

// TestPipelineNoScript flushes the script cache before a batch of every
// algorithm: the batch falls back to EVAL and the scripts are cached again.
func TestPipelineNoScript(t *testing.T) {
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb, redisstore.WithPipeline(time.Millisecond, 64))
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, a := range tollgate.Algorithms() {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				limit := tollgate.Limit{Algorithm: a, Rate: 10, Period: time.Second, Burst: 10}
				if res, err := s.AllowN(ctx, key(t), limit, 1); err != nil || !res.Allowed {
					t.Errorf("%s after SCRIPT FLUSH: %+v, %v", a, res, err)
				}
			}()
		}
	}
	wg.Wait()
	for _, a := range tollgate.Algorithms() {
		sha := redis.NewScript(redisstore.Source(a)).Hash()
		if ok, err := rdb.ScriptExists(ctx, sha).Result(); err != nil || !ok[0] {
			t.Errorf("%s: script not cached after the fallback (%v, %v)", a, ok, err)
		}
	}
}

// TestPipelineDeadline pauses Redis (SIGSTOP) while a batch is in flight:
// every caller returns when its own context ends — with
// ContextTimeoutEnabled off, although go-redis itself would wait for its
// read timeout; with it on, also the first, sent alone from its caller's
// goroutine — and once the server answers again no goroutine is left
// behind.
func TestPipelineDeadline(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", bound), func(t *testing.T) { testPipelineDeadline(t, bound) })
	}
}

func testPipelineDeadline(t *testing.T, bound bool) {
	srv := redistest.NewServer(t) // its process's goroutines are not ours
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 5 * time.Second, ContextTimeoutEnabled: bound})
	defer rdb.Close()
	s := redisstore.New(rdb, redisstore.WithPipeline(50*time.Microsecond, 8))
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	// A deadline that holds, not a speed: the margin is wide because the
	// machine running the tests may be busy (a hang would be the read
	// timeout, 5 s, or forever).
	const margin = time.Second
	timeouts := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := timeouts[i%len(timeouts)]
			cctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			start := time.Now()
			_, err := s.AllowN(cctx, key(t), tollgate.PerSecond(10), 1)
			if took := time.Since(start); took > d+margin {
				t.Errorf("deadline %v: returned after %v", d, took)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("deadline %v: err = %v, want context.DeadlineExceeded", d, err)
			}
		}()
	}
	// A caller whose context is cancelled (not timed out) leaves at once too.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(30*time.Millisecond, cancel)
	start := time.Now()
	if _, err := s.AllowN(cctx, key(t), tollgate.PerSecond(10), 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 30*time.Millisecond+margin {
		t.Errorf("cancelled after 30ms: returned after %v", took)
	}
	wg.Wait()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The server answers again: decisions go through.
	if res, err := s.AllowN(ctx, key(t), tollgate.PerSecond(10), 1); err != nil || !res.Allowed {
		t.Fatalf("after Resume: %+v, %v", res, err)
	}
	rdb.Close()
}

// TestPipelineRedisDown: with the server stopped, every decision of a batch
// gets the connection error; none panics or hangs.
func TestPipelineRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	s := redisstore.New(srv.Client(t), redisstore.WithPipeline(50*time.Microsecond, 8))
	ctx := context.Background()
	if _, err := s.AllowN(ctx, "k", tollgate.PerSecond(1), 1); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if _, err := s.AllowN(cctx, "k", tollgate.PerSecond(1), 1); err == nil {
				t.Error("AllowN with Redis stopped: err = nil")
			}
		}()
	}
	wg.Wait()
}

// TestPipelineDefault: a store New makes on a *redis.Client gathers
// concurrent decisions into pipelines, and sends a decision with a deadline
// made while nothing is in flight alone, as a plain call that carries its
// caller's context; on a Cluster, or with WithPipeline(0, 0), every
// decision is a call of its own.
func TestPipelineDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		client    func(*testing.T) redis.UniversalClient
		opts      []redisstore.Option
		pipelined bool
	}{
		{"standalone", standalone, nil, true},
		{"standalone, WithPipeline(0, 0)", standalone, []redisstore.Option{redisstore.WithPipeline(0, 0)}, false},
		{"cluster", clustered, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := tc.client(t)
			var pipelines, cmds, alone, marked atomic.Int64
			rdb.AddHook(pipeHook{pipelines: &pipelines, cmds: &cmds, alone: &alone, marked: &marked})
			s := redisstore.New(rdb, tc.opts...)
			limit := tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 1000}
			k := key(t)
			ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxMark{}, true), time.Minute)
			defer cancel()
			// One decision alone, with a deadline: a plain call (EVALSHA,
			// and EVAL if the server lacks the script) under its caller's
			// context, whatever the mode.
			if _, err := s.AllowN(ctx, k, limit, 1); err != nil {
				t.Fatal(err)
			}
			if p, a, m := pipelines.Load(), alone.Load(), marked.Load(); p != 0 || a == 0 || m != a {
				t.Fatalf("one decision alone: %d pipelines, %d calls alone, %d of them with the caller's context; want none, some, all", p, a, m)
			}
			// Concurrent decisions.
			const goroutines, each = 32, 20
			var wg sync.WaitGroup
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						if _, err := s.AllowN(ctx, k, limit, 1); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			res, err := s.AllowN(ctx, k, limit, 0)
			if got, want := res.Remaining, 1000-1-goroutines*each; err != nil || got != want {
				t.Fatalf("remaining %d (%v), want %d", got, err, want)
			}
			if got := pipelines.Load() > 0; got != tc.pipelined {
				t.Errorf("%d pipelines, %d calls alone: pipelined %v, want %v", pipelines.Load(), alone.Load(), got, tc.pipelined)
			}
		})
	}
}
