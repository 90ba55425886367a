package tiered_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
)

// server is shared by the tests that do not stop or pause Redis; those
// start servers of their own.
var server *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &server) }

func key(tb testing.TB) string { return fmt.Sprintf("%s:%d", tb.Name(), rand.Int64()) }

// untimed leaves the global store's calls without a timeout of their own, for
// the tests of answers and counts: on a busy machine a call could outlast
// the default timeout, be decided in degraded mode and reconnect (more
// commands). The fault tests cover timeouts.
var untimed = tiered.WithTimeout(0)

// overRedis is the conformance backend of a tiered store in front of
// redisstore: every answer, local or global, must be what the table says.
// With the denial cache, the store refuses refunds, which the settle table
// makes: it is then shown to the table as a Store, not a Settler.
func overRedis(cache bool) conformance.Backend {
	return conformance.Backend{
		New: func(t *testing.T, now func() time.Time) tollgate.Store {
			return newTested(redisstore.New(server.Client(t), redisstore.WithClock(now)), now, cache)
		},
		TTL: func(t *testing.T, s tollgate.Store, key string, limit tollgate.Limit) (time.Duration, bool) {
			d, err := server.Client(t).PTTL(context.Background(), redisstore.New(nil).Key(key, limit)).Result()
			if err != nil {
				t.Fatal(err)
			}
			return d, d > 0
		},
		TTLSlack: time.Second,
		TTLGrain: time.Millisecond,
	}
}

// overMemory is the same in front of a memorystore: no Redis, so the
// differential test can afford many steps. (Its TTLs are memorystore's,
// tested there.)
func overMemory(cache bool) conformance.Backend {
	return conformance.Backend{
		New: func(t *testing.T, now func() time.Time) tollgate.Store {
			return newTested(memorystore.New(memorystore.WithClock(now)), now, cache)
		},
	}
}

// newTested is the tiered store a conformance backend tests, over global.
func newTested(global tollgate.Store, now func() time.Time, cache bool) tollgate.Store {
	if !cache {
		return tiered.New(global, tiered.WithClock(now), untimed)
	}
	return struct{ tollgate.Store }{tiered.New(global, tiered.WithClock(now), untimed, tiered.WithDenialCache())}
}

// TestConformance: the local tier never changes an answer. The table's
// scenarios deny and then retry at exact instants, so a remembered denial
// that is off by a microsecond, or a Remaining that is wrong, fails here;
// the differential tests compare tens of thousands of random calls with a
// memorystore's answers.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) { t.Parallel(); conformance.Run(t, overRedis(true)) })
	t.Run("memory", func(t *testing.T) { t.Parallel(); conformance.Run(t, overMemory(true)) })
	// Without the cache the store is a Settler: the settle table too.
	t.Run("redis without cache", func(t *testing.T) { t.Parallel(); conformance.Run(t, overRedis(false)) })
	t.Run("differential redis", func(t *testing.T) {
		t.Parallel()
		conformance.Differential(t, overRedis(true), conformance.T0, 2000, 11)
	})
	t.Run("differential memory", func(t *testing.T) {
		t.Parallel()
		for seed := uint64(1); seed <= 5; seed++ {
			conformance.Differential(t, overMemory(true), conformance.T0, 20000, seed)
		}
	})
}

// counted returns a client of srv and a counter of every command it sends
// but a new connection's handshake (HELLO, CLIENT SETINFO). The scripts are
// loaded first, so that no EVAL fallback adds a command.
func counted(t *testing.T, srv *redistest.Server) (*redis.Client, *atomic.Int64) {
	rdb := srv.Client(t)
	if err := redisstore.New(rdb).Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	rdb.AddHook(countHook{&n})
	return rdb, &n
}

type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.count(cmds...); return next(ctx, cmds) }
}
func (h countHook) count(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if n := c.Name(); n != "hello" && n != "client" {
			h.n.Add(1)
		}
	}
}

// TestAbusiveClient sends requests at 100 times a key's limit for a second,
// on real Redis with its own clock, and counts the commands that reach
// Redis: at least 99% of the denials must be answered locally. What is
// admitted stays exactly what the limit admits.
func TestAbusiveClient(t *testing.T) {
	t.Parallel()
	const rate, factor = 20, 100 // 20 per second, sent at 2,000 per second
	const span = time.Second
	for _, tc := range []struct {
		alg  tollgate.Algorithm
		want float64 // the share of denials answered locally
	}{
		{tollgate.TokenBucket, 0.99},
		{tollgate.GCRA, 0.99},
		{tollgate.LeakyBucket, 0.99},
		{tollgate.FixedWindow, 0.99},
		{tollgate.SlidingWindowLog, 0.99},
		// The sliding counter frees room one request at a time, and an
		// admission that leaves none does not say for how long: one
		// denial per admitted request goes to Redis, 1 in 99 at 100×.
		{tollgate.SlidingWindowCounter, 0.98},
	} {
		t.Run(tc.alg.String(), func(t *testing.T) {
			t.Parallel()
			rdb, sent := counted(t, server)
			s := tiered.New(redisstore.New(rdb), tiered.WithDenialCache(), untimed)
			limit := tollgate.Limit{Algorithm: tc.alg, Rate: rate, Period: time.Second, Burst: rate}
			k := key(t)
			ctx := context.Background()
			var allowed, denied int
			start := time.Now()
			for i := 0; i < rate*factor; i++ {
				if d := time.Duration(i) * span / (rate * factor); time.Since(start) < d {
					time.Sleep(d - time.Since(start))
				}
				res, err := s.AllowN(ctx, k, limit, 1)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					allowed++
				} else {
					denied++
					if res.RetryAfter <= 0 || res.Remaining != 0 {
						t.Fatalf("denial %d: %+v", denied, res)
					}
				}
			}
			elapsed := time.Since(start)
			st := s.Stats()
			local := float64(st.LocalDenials) / float64(denied)
			t.Logf("%d sent in %v: %d allowed, %d denied, %d answered locally (%.2f%%), %d Redis commands",
				rate*factor, elapsed.Round(time.Millisecond), allowed, denied, st.LocalDenials, 100*local, sent.Load())
			if local < tc.want {
				t.Errorf("%.2f%% of denials answered locally, want at least %.0f%%", 100*local, 100*tc.want)
			}
			if got := sent.Load(); got != int64(st.GlobalCalls) {
				t.Errorf("%d Redis commands, %d global calls counted", got, st.GlobalCalls)
			}
			// Nothing admitted beyond the limit: burst + refill (fixed window:
			// at most two windows' worth).
			if most := rate + int(float64(rate)*elapsed.Seconds()) + 1; allowed > most || allowed < rate {
				t.Errorf("%d allowed, want %d to %d", allowed, rate, most)
			}
		})
	}
}

// TestLocalDenialFields checks a local answer field by field against what
// the global store says at the same instant, on a fixed clock.
func TestLocalDenialFields(t *testing.T) {
	t.Parallel()
	clock := conformance.NewClock()
	rdb, sent := counted(t, server)
	rdb.AddHook(lastingHook{rdb}) // the clock stands still while Redis counts TTLs in real time
	global := redisstore.New(rdb, redisstore.WithClock(clock.Now))
	s := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithDenialCache(), untimed)
	ctx := context.Background()
	for _, limit := range []tollgate.Limit{
		{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 10},
		{Algorithm: tollgate.TokenBucket, Rate: 7, Period: time.Second, Burst: 10},
		{Algorithm: tollgate.GCRA, Rate: 3, Period: time.Second, Burst: 10},
		{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 10},
		{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 2, MaxDelay: time.Second},
		{Algorithm: tollgate.FixedWindow, Rate: 10, Period: time.Minute},
		{Algorithm: tollgate.SlidingWindowLog, Rate: 10, Period: time.Second},
		{Algorithm: tollgate.SlidingWindowCounter, Rate: 10, Period: time.Second},
	} {
		t.Run(limit.String(), func(t *testing.T) {
			k := key(t)
			clock.Set(0)
			for i := 0; i < limit.Capacity(); i++ {
				if _, err := s.AllowN(ctx, k, limit, 1); err != nil {
					t.Fatal(err)
				}
			}
			res, err := s.AllowN(ctx, k, limit, 1) // denied by Redis, remembered
			if err != nil || res.Allowed {
				t.Fatalf("past the capacity: %+v, %v", res, err)
			}
			edge := res.RetryAfter - time.Microsecond // the last instant before the retry
			for _, at := range []time.Duration{0, time.Millisecond, 33333 * time.Microsecond, res.RetryAfter / 2, edge} {
				for _, n := range []int{1, 2, 3} {
					if n > limit.Capacity() {
						continue
					}
					clock.Set(at)
					before := sent.Load()
					got, err := s.AllowN(ctx, k, limit, n)
					if err != nil {
						t.Fatal(err)
					}
					local := sent.Load() == before
					want, err := global.AllowN(ctx, k, limit, 0) // look: what Redis holds now
					if err != nil {
						t.Fatal(err)
					}
					if local {
						// A local answer must be the denial Redis gives.
						w, err := global.AllowN(ctx, k, limit, n)
						if err != nil {
							t.Fatal(err)
						}
						if w.Allowed {
							t.Fatalf("at %v, n %d: denied locally, Redis admits (state %+v)", at, n, want)
						}
						if got != w {
							t.Errorf("at %v, n %d:\nlocal %+v\nRedis %+v", at, n, got, w)
						}
					}
					if got.Allowed {
						return // spent: the rest of the table is about another state
					}
					if n == 1 && !local {
						t.Errorf("at %v: cost 1 after a denial went to Redis", at)
					}
				}
			}
		})
	}
}

// TestInvalidInput: rejected before anything is sent.
func TestInvalidInput(t *testing.T) {
	t.Parallel()
	rdb, sent := counted(t, server)
	s := tiered.New(redisstore.New(rdb))
	ctx := context.Background()
	for _, tc := range []struct {
		key   string
		limit tollgate.Limit
		n     int
		want  error
	}{
		{"", tollgate.PerSecond(1), 1, tollgate.ErrInvalidKey},
		{"k", tollgate.Limit{Rate: 0, Period: time.Second, Burst: 1}, 1, tollgate.ErrInvalidLimit},
		{"k", tollgate.PerSecond(5), -1, tollgate.ErrInvalidCost},
		{"k", tollgate.PerSecond(5), 6, tollgate.ErrCostExceedsBurst},
	} {
		if _, err := s.AllowN(ctx, tc.key, tc.limit, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("AllowN(%q, %v, %d): err = %v, want %v", tc.key, tc.limit, tc.n, err, tc.want)
		}
	}
	if err := s.Reset(ctx, "", tollgate.PerSecond(1)); !errors.Is(err, tollgate.ErrInvalidKey) {
		t.Errorf("Reset with an empty key: err = %v", err)
	}
	if got := sent.Load(); got != 0 {
		t.Errorf("%d commands sent for invalid input", got)
	}
	if st := s.Stats(); st.GlobalCalls != 0 || st.Degraded != 0 || st.State != tiered.Closed {
		t.Errorf("stats after invalid input: %+v", st)
	}
}

// TestReset forgets the remembered denial along with the global state.
func TestReset(t *testing.T) {
	t.Parallel()
	s := tiered.New(redisstore.New(server.Client(t)), tiered.WithDenialCache(), untimed)
	ctx := context.Background()
	k, limit := key(t), tollgate.PerMinute(1)
	for i, want := range []bool{true, false, false} {
		if res, err := s.AllowN(ctx, k, limit, 1); err != nil || res.Allowed != want {
			t.Fatalf("call %d: %+v, %v; want Allowed %v", i, res, err, want)
		}
	}
	// The admission that left nothing was remembered: both denials local.
	if st := s.Stats(); st.LocalDenials != 2 || st.GlobalCalls != 1 {
		t.Fatalf("LocalDenials = %d, GlobalCalls = %d; want 2 and 1", st.LocalDenials, st.GlobalCalls)
	}
	if err := s.Reset(ctx, k, limit); err != nil {
		t.Fatal(err)
	}
	if res, err := s.AllowN(ctx, k, limit, 1); err != nil || !res.Allowed {
		t.Fatalf("after Reset: %+v, %v", res, err)
	}
}
