package redisstore_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/redisstore"
)

// loaded is modelTarget with Load called on every new store, so that its
// decisions call the function library (on Redis 7) instead of the scripts.
func loaded(client func(*testing.T) redis.UniversalClient) conformance.ModelTarget {
	m := modelTarget(client)
	newStore := m.New
	m.New = func(tb testing.TB, now func() time.Time) tollgate.Store {
		s := newStore(tb, now)
		if err := s.(*timedStore).Load(context.Background()); err != nil {
			tb.Fatal(err)
		}
		return s
	}
	return m
}

// TestFunctionsModel runs the model's cases and random calls on stores
// that call the function library.
func TestFunctionsModel(t *testing.T) {
	t.Parallel()
	s := modelSeedFor(t)
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
	}{{"standalone", standalone}, {"cluster", clustered}} {
		t.Run(topo.name+"/cases", func(t *testing.T) {
			t.Parallel()
			conformance.RunModelCases(t, loaded(topo.client))
		})
		for _, alg := range tollgate.Algorithms() {
			t.Run(topo.name+"/"+alg.String(), func(t *testing.T) {
				t.Parallel()
				conformance.ModelDifferential(t, loaded(topo.client), alg, rand.NewPCG(s, uint64(alg)+100), *modelSteps)
			})
		}
	}
}

// callHook counts the commands that make decisions, by name.
type callHook struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *callHook) count(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		if name := c.Name(); name == "fcall" || name == "evalsha" || name == "eval" {
			h.n[name]++
		}
	}
}

func (h *callHook) take() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.n
	h.n = map[string]int{}
	return n
}

func (h *callHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *callHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *callHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.count(cmds...); return next(ctx, cmds) }
}

// TestFunctionsFallback follows one store, plain and in pipelines, through
// the library's life on a server of its own: scripts before Load,
// functions after it; when the server has lost the library (FUNCTION
// FLUSH), the decision that finds out still gets its answer, from the
// script, and the store keeps to scripts until the next Load.
func TestFunctionsFallback(t *testing.T) {
	t.Parallel()
	for _, pipelined := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "pipelined"}[pipelined], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			srv := redistest.NewServer(t)
			rdb := srv.Client(t)
			h := &callHook{n: map[string]int{}}
			rdb.AddHook(h)
			s := redisstore.New(rdb, redisstore.WithPipeline(0, 0))
			if pipelined {
				s = redisstore.New(rdb, redisstore.WithPipeline(50*time.Microsecond, 8))
			}
			limit := tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 10}
			k := key(t)
			remaining := 10
			decide := func(step string, want map[string]int) {
				t.Helper()
				remaining--
				var res tollgate.Result
				var err error
				if pipelined {
					// A decision alone goes as it would unpipelined: send a
					// batch, which goes as a pipeline.
					calls := []redisstore.BatchCall{{Key: k, Limit: limit, N: 1}}
					redisstore.ExecBatch(s, calls)
					res, err = calls[0].Res, calls[0].Err
				} else {
					res, err = s.AllowN(ctx, k, limit, 1)
				}
				if err != nil || !res.Allowed || res.Remaining != remaining {
					t.Fatalf("%s: %+v, %v; want allowed with %d remaining", step, res, err, remaining)
				}
				got := h.take()
				for _, name := range []string{"fcall", "evalsha", "eval"} {
					if got[name] != want[name] {
						t.Errorf("%s: calls %v, want %v", step, got, want)
						break
					}
				}
			}
			decide("before Load", map[string]int{"evalsha": 1, "eval": 1})
			if err := s.Load(ctx); err != nil {
				t.Fatal(err)
			}
			h.take()
			decide("after Load", map[string]int{"fcall": 1})
			if err := rdb.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			// A pipeline sends what FCALL could not decide by EVAL at once.
			lost := map[string]int{"fcall": 1, "evalsha": 1}
			if pipelined {
				lost = map[string]int{"fcall": 1, "eval": 1}
			}
			decide("library lost", lost)
			decide("after the loss", map[string]int{"evalsha": 1})
			if err := s.Load(ctx); err != nil {
				t.Fatal(err)
			}
			h.take()
			decide("loaded again", map[string]int{"fcall": 1})
		})
	}
}

// TestFunctionsUnavailable: on a server without functions (as Redis 6.2,
// here by renaming the commands away), Load succeeds and the store runs
// its scripts.
func TestFunctionsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.NewServer(t, redistest.WithArgs("--rename-command", "FUNCTION", "", "--rename-command", "FCALL", ""))
	rdb := srv.Client(t)
	if err := rdb.FunctionList(ctx, redis.FunctionListQuery{}).Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("FUNCTION LIST: err = %v, want an unknown command", err)
	}
	h := &callHook{n: map[string]int{}}
	rdb.AddHook(h)
	s := redisstore.New(rdb)
	if err := s.Load(ctx); err != nil {
		t.Fatalf("Load without functions: %v", err)
	}
	h.take()
	for i := range 3 {
		res, err := s.AllowN(ctx, "k", tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 3}, 1)
		if err != nil || !res.Allowed || res.Remaining != 2-i {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if got := h.take(); got["evalsha"] != 3 || got["fcall"] != 0 {
		t.Errorf("calls %v, want 3 EVALSHA", got)
	}
}
