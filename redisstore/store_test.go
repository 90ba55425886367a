package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/redisstore"
)

// One standalone server and one 3-master cluster serve every test in the
// package; tests use keys of their own instead of flushing.
var (
	server  *redistest.Server
	cluster *redistest.Cluster
)

func TestMain(m *testing.M) {
	if os.Getenv(raceChildEnv) != "" {
		raceChild() // a re-executed copy of this binary: see race_test.go
		return
	}
	if os.Getenv(settleChildEnv) != "" {
		settleChild() // see settle_race_test.go
		return
	}
	if os.Getenv(allChildEnv) != "" {
		allChild() // see together_test.go
		return
	}
	var err error
	if server, err = redistest.StartServer(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if cluster, err = redistest.StartCluster(3, 0); err != nil {
		server.Close()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cluster.Close()
	server.Close()
	os.Exit(code)
}

func standalone(t *testing.T) redis.UniversalClient { return server.Client(t) }
func clustered(t *testing.T) redis.UniversalClient  { return cluster.Client(t) }

func backend(client func(*testing.T) redis.UniversalClient) conformance.Backend {
	return conformance.Backend{
		New: func(t *testing.T, now func() time.Time) tollgate.Store {
			return redisstore.New(client(t), redisstore.WithClock(now))
		},
		TTL: func(t *testing.T, s tollgate.Store, key string, limit tollgate.Limit) (time.Duration, bool) {
			d, err := client(t).PTTL(context.Background(), s.(*redisstore.Store).Key(key, limit)).Result()
			if err != nil {
				t.Fatal(err)
			}
			return d, d > 0
		},
		// Redis counts TTLs in real milliseconds while the test's clock
		// stands still; a second of slack covers a slow machine.
		TTLSlack: time.Second,
		TTLGrain: time.Millisecond,
		// Run's settle scenarios (conformance.RunSettle) must run.
		Settles: true,
	}
}

func TestConformance(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { conformance.Run(t, backend(standalone)) })
	t.Run("cluster", func(t *testing.T) { conformance.Run(t, backend(clustered)) })
}

func TestDifferential(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		conformance.Differential(t, backend(standalone), conformance.T0, 4000, 1)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		conformance.Differential(t, backend(clustered), conformance.T0, 1500, 2)
	})
	// Far in the future a time in µs has 16 digits: the scripts must keep
	// every one of them (tostring would keep 14).
	t.Run("year 2200", func(t *testing.T) {
		t.Parallel()
		conformance.Differential(t, backend(standalone), time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), 1500, 3)
	})
}

func TestEquivalences(t *testing.T) {
	t.Parallel()
	conformance.Equivalences(t, backend(standalone), 1000, 4)
}

func key(t *testing.T) string { return fmt.Sprintf("%s:%d", t.Name(), rand.Int64()) }

// TestServerTime runs with no clock option: the scripts read Redis TIME.
func TestServerTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	k := key(t)
	limit := tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 3}
	for i, want := range []bool{true, true, true, false} {
		res, err := s.AllowN(ctx, k, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed != want {
			t.Fatalf("call %d: Allowed = %v, want %v", i, res.Allowed, want)
		}
		if !want && (res.RetryAfter <= 59*time.Minute || res.RetryAfter > time.Hour) {
			t.Errorf("RetryAfter = %v, want just under an hour", res.RetryAfter)
		}
	}
	// The state carries the server's time, to the µs.
	ts, err := bucketInt(ctx, rdb, s.Key(k, limit), "ts")
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d := now.UnixMicro() - ts; d < 0 || d > int64(time.Minute/time.Microsecond) {
		t.Errorf("stored ts %d is %dµs from the server's time", ts, d)
	}
}

// TestHighRatePrecision drives a limit of 300,000 per 7 s (a token every
// 23⅓ µs) through thousands of refills and checks every token arrives at the
// exact µs: after the burst is spent at 0, token k is due at ⌈k·70/3⌉ µs —
// denied a µs earlier with RetryAfter 1µs, allowed then. Floating-point
// tokens drift off this within a few hundred refills. (The burst is large so
// the bucket never fills up — a full bucket rightly drops further refill —
// and so that its TTL, the 23 s it takes to refill, outlasts the test in real
// time: Redis expires keys on its own clock, not the test's.)
func TestHighRatePrecision(t *testing.T) {
	t.Parallel()
	for _, alg := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := conformance.NewClock()
			s := redisstore.New(server.Client(t), redisstore.WithClock(clock.Now))
			limit := tollgate.Limit{Algorithm: alg, Rate: 300_000, Period: 7 * time.Second, Burst: 1_000_000}
			k := key(t)
			call := func(at int64, n int) tollgate.Result {
				clock.Set(time.Duration(at) * time.Microsecond)
				res, err := s.AllowN(ctx, k, limit, n)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			if !call(0, limit.Burst).Allowed {
				t.Fatal("spending the burst at 0: denied")
			}
			for i := int64(1); i <= 3000; i++ {
				at := (i*70 + 2) / 3 // ⌈i·70/3⌉
				if res := call(at-1, 1); res.Allowed || res.RetryAfter != time.Microsecond {
					t.Fatalf("token %d: at %dµs got %+v, want denied with RetryAfter 1µs", i, at-1, res)
				}
				if res := call(at, 1); !res.Allowed {
					t.Fatalf("token %d: denied at %dµs, when it is due", i, at)
				}
			}
		})
	}
}

// TestFarFutureTimestamps checks the stored time keeps all 16 digits.
func TestFarFutureTimestamps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2200, 1, 1, 0, 0, 0, 123457000, time.UTC) // 7,258,118,400,123,457 µs
	rdb := server.Client(t)
	s := redisstore.New(rdb, redisstore.WithClock(func() time.Time { return at }))
	k := key(t)
	res, err := s.AllowN(ctx, k, tollgate.PerSecond(2), 1)
	if err != nil || !res.Allowed {
		t.Fatalf("AllowN = %+v, %v", res, err)
	}
	got, err := bucketField(ctx, rdb, s.Key(k, tollgate.PerSecond(2)), "ts")
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatInt(at.UnixMicro(), 10); got != want {
		t.Errorf("stored ts = %s, want %s", got, want)
	}
	past := redisstore.New(rdb, redisstore.WithClock(func() time.Time { return time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC) }))
	if _, err := past.AllowN(ctx, k, tollgate.PerSecond(2), 1); err == nil {
		t.Error("a clock beyond what a double holds exactly: err = nil, want an error")
	}
}

// TestNoScript flushes the script cache and calls every algorithm: the
// store must fall back from EVALSHA to EVAL, after which the script is
// cached again.
func TestNoScript(t *testing.T) {
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	for _, a := range tollgate.Algorithms() {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		limit := tollgate.Limit{Algorithm: a, Rate: 10, Period: time.Second, Burst: 10}
		if res, err := s.AllowN(ctx, key(t), limit, 1); err != nil || !res.Allowed {
			t.Fatalf("%s after SCRIPT FLUSH: %+v, %v", a, res, err)
		}
		sha := redis.NewScript(redisstore.Source(a)).Hash()
		if ok, err := rdb.ScriptExists(ctx, sha).Result(); err != nil || !ok[0] {
			t.Errorf("%s: script not cached after the fallback (%v, %v)", a, ok, err)
		}
	}
}

// TestEveryKeyHasTTL makes random decisions on every algorithm and then
// requires a TTL on every key the store wrote.
func TestEveryKeyHasTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	prefix := fmt.Sprintf("ttl%d:", rand.Int64())
	s := redisstore.New(rdb, redisstore.WithPrefix(prefix))
	for i := 0; i < 600; i++ {
		a := tollgate.Algorithms()[i%6]
		limit := tollgate.Limit{Algorithm: a, Rate: 5, Period: time.Minute, Burst: 5}
		if _, err := s.AllowN(ctx, strconv.Itoa(i%20), limit, 1+i%5); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 20*6/2 && len(keys) < 20 {
		t.Fatalf("found %d keys, want dozens", len(keys))
	}
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 {
			t.Errorf("%s has TTL %v", k, ttl)
		}
	}
}

// TestSlidingLogStaysBounded hammers a sliding window log far past its limit:
// denied requests add nothing, so the set never holds more than the limit.
func TestSlidingLogStaysBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	limit := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 50, Period: time.Minute}
	k := key(t)
	allowed := 0
	for i := 0; i < 500; i++ {
		res, err := s.AllowN(ctx, k, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			allowed++
		}
	}
	n, err := rdb.ZCard(ctx, s.Key(k, limit)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if allowed != 50 || n != 50 {
		t.Errorf("allowed %d, set holds %d; want 50 and 50", allowed, n)
	}
}

// TestSameSlot checks the hash tag: every key the store writes for one
// caller's key, whatever the algorithm and period, is in one Cluster slot.
func TestSameSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := cluster.Client(t)
	s := redisstore.New(rdb)
	// (A key that starts with "}" gives an empty tag, which Redis ignores:
	// its states may land in different slots. That is harmless — each
	// limit's state is one Redis key — and so is not tested here.)
	for _, k := range []string{"user:42", "a{b}c", "{", "{}", "ключ"} {
		var slots []int64
		for _, a := range tollgate.Algorithms() {
			for _, p := range []time.Duration{time.Second, time.Hour} {
				slot, err := rdb.ClusterKeySlot(ctx, s.Key(k, tollgate.Limit{Algorithm: a, Period: p})).Result()
				if err != nil {
					t.Fatal(err)
				}
				slots = append(slots, slot)
			}
		}
		for _, slot := range slots[1:] {
			if slot != slots[0] {
				t.Errorf("key %q: slots %v, want all equal", k, slots)
				break
			}
		}
	}
}

// TestInvalidInputSendsNothing counts the commands the client sends.
func TestInvalidInputSendsNothing(t *testing.T) {
	t.Parallel()
	rdb := server.Client(t)
	if err := rdb.Ping(context.Background()).Err(); err != nil { // connect first: the handshake is not ours to count
		t.Fatal(err)
	}
	var sent atomic.Int64
	rdb.AddHook(countHook{&sent})
	s := redisstore.New(rdb)
	ctx := context.Background()
	bad := []struct {
		key   string
		limit tollgate.Limit
		n     int
	}{
		{"", tollgate.PerSecond(1), 1},
		{"k", tollgate.Limit{Rate: -1, Period: time.Second, Burst: 1}, 1},
		{"k", tollgate.PerSecond(5), 6},
		{"k", tollgate.PerSecond(5), -1},
	}
	for i, b := range bad {
		if _, err := s.AllowN(ctx, b.key, b.limit, b.n); err == nil {
			t.Errorf("AllowN(%q, %v, %d): err = nil", b.key, b.limit, b.n)
		}
		if i < 2 { // Reset takes no cost: only a bad key or limit is invalid
			if err := s.Reset(ctx, b.key, b.limit); err == nil {
				t.Errorf("Reset(%q, %v): err = nil", b.key, b.limit)
			}
		}
	}
	if got := sent.Load(); got != 0 {
		t.Errorf("%d commands sent for invalid input, want 0", got)
	}
}

type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestCorruptState: a key holding something tollgate did not write is an
// error naming the key, never a panic.
func TestCorruptState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	for _, tc := range []struct {
		alg   tollgate.Algorithm
		write func(k string) error
	}{
		{tollgate.TokenBucket, func(k string) error { return rdb.HSet(ctx, k, "t", "x", "ts", "1", "u", "1").Err() }},
		{tollgate.GCRA, func(k string) error { return rdb.Set(ctx, k, "soon", 0).Err() }},
		{tollgate.FixedWindow, func(k string) error { return rdb.Set(ctx, k, "1", 0).Err() }}, // WRONGTYPE
		{tollgate.SlidingWindowLog, func(k string) error { return rdb.ZAdd(ctx, k, redis.Z{Score: 1e18, Member: "nosequence"}).Err() }},
	} {
		limit := tollgate.Limit{Algorithm: tc.alg, Rate: 5, Period: time.Second, Burst: 5}
		k := key(t)
		if err := tc.write(s.Key(k, limit)); err != nil {
			t.Fatal(err)
		}
		_, err := s.AllowN(ctx, k, limit, 1)
		if err == nil {
			t.Errorf("%s on corrupt state: err = nil", tc.alg)
		} else if strings.Contains(err.Error(), k) {
			t.Errorf("%s: error %q names the key; keys are client data and errors are logged", tc.alg, err)
		}
	}
}

func TestReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	k, limit := key(t), tollgate.PerMinute(1)
	if res, _ := s.AllowN(ctx, k, limit, 1); !res.Allowed {
		t.Fatal("first call denied")
	}
	if err := s.Reset(ctx, k, limit); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, s.Key(k, limit)).Result(); n != 0 {
		t.Error("key still exists after Reset")
	}
	if res, _ := s.AllowN(ctx, k, limit, 1); !res.Allowed {
		t.Error("denied after Reset")
	}
}

func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	s := redisstore.New(srv.Client(t))
	ctx := context.Background()
	if _, err := s.AllowN(ctx, "k", tollgate.PerSecond(1), 1); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err := s.AllowN(ctx, "k", tollgate.PerSecond(1), 1)
	if err == nil {
		t.Fatal("AllowN with Redis stopped: err = nil")
	}
	if errors.Is(err, tollgate.ErrInvalidLimit) {
		t.Fatalf("err = %v, want a connection error", err)
	}
}

func TestChanges(t *testing.T) {
	t.Parallel()
	conformance.Changes(t, backend(standalone), 3000, 6)
}

func TestEquivalencesCluster(t *testing.T) {
	t.Parallel()
	conformance.Equivalences(t, backend(clustered), 500, 8)
}
