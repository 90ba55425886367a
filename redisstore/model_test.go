package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/redisstore"
)

// go test ./redisstore/ -run TestModelLong -steps=100000 runs 100,000
// random calls per algorithm and topology against the reference model;
// -steps scales every model test here (TestModelEnds, TestModelRealTime,
// TestSettleModel, TestFunctionsModel). The default is short enough for every
// test run.
var (
	modelSteps = flag.Int("steps", 300, "random calls per algorithm and topology in the model tests (TestModelLong and others)")
	modelSeed  = flag.Uint64("seed", 1, "seed of the model tests' calls (0: a new one each run)")
)

// keep is how long a checked key is kept in real time. Redis expires keys
// in real time while the test's clock jumps, so the test reads the TTL a
// call set, lengthens it to outlive the test, and expires the key itself
// (DEL) once the test's clock reaches the model's expiry.
const keep = time.Hour

// timedStore remembers when its last decision was sent, to bound the real
// time a TTL has run, and reads the test's clock.
type timedStore struct {
	*redisstore.Store
	rdb  redis.UniversalClient // the store's client, for the checks: one per test
	now  func() time.Time
	sent time.Time
}

func (s *timedStore) AllowN(ctx context.Context, key string, l tollgate.Limit, n int) (tollgate.Result, error) {
	s.sent = time.Now()
	return s.Store.AllowN(ctx, key, l, n)
}

func (s *timedStore) AllowAll(ctx context.Context, key string, limits []tollgate.Limit, n int, dst []tollgate.Result) ([]tollgate.Result, error) {
	s.sent = time.Now()
	return s.Store.AllowAll(ctx, key, limits, n, dst)
}

func (s *timedStore) ReserveN(ctx context.Context, key string, l tollgate.Limit, n int) (tollgate.Result, int64, error) {
	s.sent = time.Now()
	return s.Store.ReserveN(ctx, key, l, n)
}

func (s *timedStore) SettleN(ctx context.Context, key string, l tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, error) {
	s.sent = time.Now()
	return s.Store.SettleN(ctx, key, l, at, reserved, actual)
}

// modelTarget checks a Redis store against the model, and what it keeps in
// Redis: a call that spends nothing leaves the key as it was (DUMP), but
// for a bucket's expiry when the call moved it; every call that sets the
// key's expiry in the model (a write, or a denial or look that found it
// live) sets the TTL to the model's, ResetAfter rounded up to a
// millisecond; a bucket's stored expiry (e) is the model's, to the
// microsecond; and a key the model holds nothing for after a call is gone.
func modelTarget(client func(*testing.T) redis.UniversalClient) conformance.ModelTarget {
	return conformance.ModelTarget{
		New: func(tb testing.TB, now func() time.Time) tollgate.Store {
			rdb := client(tb.(*testing.T))
			return &timedStore{Store: redisstore.New(rdb, redisstore.WithClock(now)), rdb: rdb, now: now}
		},
		Expire: func(tb testing.TB, s tollgate.Store, key string, l tollgate.Limit) {
			ts := s.(*timedStore)
			if err := ts.rdb.Del(context.Background(), ts.Key(key, l)).Err(); err != nil {
				tb.Fatal(err)
			}
		},
		Before: func(tb testing.TB, s tollgate.Store, key string, l tollgate.Limit) any {
			ts := s.(*timedStore)
			return snap(tb, ts.rdb, ts.Key(key, l))
		},
		After: func(tb testing.TB, s tollgate.Store, key string, l tollgate.Limit, r tollgate.Result, wrote bool, before any, exp conformance.Expiry) bool {
			tb.Helper()
			ts := s.(*timedStore)
			rdb := ts.rdb
			name := ts.Key(key, l)
			if !exp.Held {
				if n, err := rdb.Exists(context.Background(), name).Result(); err != nil || n != 0 {
					tb.Fatalf("Redis keeps the key (%d, %v) after %v (ResetAfter %v, Allowed %v), where the model holds nothing", n, err, l, r.ResetAfter, r.Allowed)
				}
				return false
			}
			if !exp.Set {
				if !wrote {
					if after := snap(tb, rdb, name); !after.equal(before.(state), true) {
						tb.Fatalf("a call that spent nothing (%v, Allowed %v) changed what Redis keeps for the key", l, r.Allowed)
					}
				}
				checkStoredExpiry(tb, rdb, name, l, exp)
				return false
			}
			// Read the value and the TTL and lengthen it at once: the call
			// may have set a TTL of a millisecond, which runs out in real
			// time.
			ctx := context.Background()
			var (
				value *redis.StringCmd
				ttl   *redis.DurationCmd
			)
			if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				value = p.Dump(ctx, name)
				ttl = p.PTTL(ctx, name)
				p.PExpire(ctx, name, keep)
				return nil
			}); err != nil && !errors.Is(err, redis.Nil) {
				tb.Fatal(err)
			}
			// Redis counts the TTL on a millisecond clock, in real time,
			// from when the script ran: the model's expiry, rounded up.
			elapsed := time.Since(ts.sent)
			want := max(time.Millisecond, (exp.At.Sub(ts.now())+time.Millisecond-1)/time.Millisecond*time.Millisecond)
			switch got := ttl.Val(); {
			case got == -2: // gone (go-redis reports PTTL's -2 as -2ns): its TTL ran out in real time
				if elapsed < want-time.Millisecond {
					tb.Fatalf("the key vanished %v after a call that set a TTL of %v", elapsed, want)
				}
				return true
			case got < 0: // -1: no TTL
				tb.Fatalf("the key has no TTL after %v n %v (PTTL %d)", l, r, got)
			case got > want || got < want-elapsed-time.Millisecond:
				tb.Fatalf("TTL %v after %v (ResetAfter %v, Allowed %v), want the model's %v less the %v since the call", got, l, r.ResetAfter, r.Allowed, want, elapsed)
			}
			after := state{dump: []byte(value.Val())}
			if isBucket(l) {
				// Read after the TTL was lengthened: the key is still there.
				after.hash, _ = bucketFields(ctx, rdb, name)
			}
			if !wrote && !after.equal(before.(state), false) {
				tb.Fatalf("a call that spent nothing (%v, Allowed %v) changed what Redis keeps for the key", l, r.Allowed)
			}
			checkStoredExpiry(tb, rdb, name, l, exp)
			return false
		},
	}
}

// state is what Redis keeps for a key: its serialized value (nil when it
// does not exist) and, for a bucket, its fields.
type state struct {
	dump []byte
	hash map[string]string
}

// snap returns what Redis keeps for the key.
func snap(tb testing.TB, rdb redis.UniversalClient, name string) state {
	st := state{dump: dump(tb, rdb, name)}
	if st.dump != nil {
		h, err := bucketFields(context.Background(), rdb, name)
		if err == nil { // not a bucket
			st.hash = h
		}
	}
	return st
}

// equal reports whether s and o hold the same state: byte for byte when
// exact, else the same but for a bucket's expiry (e), which a call that
// spends nothing moves after a limit change.
func (s state) equal(o state, exact bool) bool {
	if bytes.Equal(s.dump, o.dump) {
		return true
	}
	if exact || s.hash == nil || o.hash == nil || len(s.hash) != len(o.hash) {
		return false
	}
	for k, v := range s.hash {
		if w, ok := o.hash[k]; !ok || k != "e" && v != w {
			return false
		}
	}
	return true
}

func isBucket(l tollgate.Limit) bool {
	return l.Algorithm == tollgate.TokenBucket || l.Algorithm == tollgate.LeakyBucket
}

// checkStoredExpiry requires a bucket's stored expiry to be the model's, to
// the microsecond.
func checkStoredExpiry(tb testing.TB, rdb redis.UniversalClient, name string, l tollgate.Limit, exp conformance.Expiry) {
	tb.Helper()
	if !isBucket(l) {
		return
	}
	got, err := bucketInt(context.Background(), rdb, name, "e")
	if errors.Is(err, redis.Nil) {
		return // the key ran out in real time: After saw it gone
	}
	if err != nil || got != exp.At.UnixMicro() {
		tb.Fatalf("the bucket's stored expiry is %d (%v), want the model's %d", got, err, exp.At.UnixMicro())
	}
}

// dump returns the key's serialized value, or nil when it does not exist.
func dump(tb testing.TB, rdb redis.UniversalClient, name string) []byte {
	v, err := rdb.Dump(context.Background(), name).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		tb.Fatal(err)
	}
	return []byte(v)
}

func modelSeedFor(t *testing.T) uint64 {
	s := *modelSeed
	if s == 0 {
		s = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -seed=%d)", s, s)
	return s
}

func TestModelLong(t *testing.T) {
	s := modelSeedFor(t)
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
	}{{"standalone", standalone}, {"cluster", clustered}} {
		for _, alg := range tollgate.Algorithms() {
			t.Run(topo.name+"/"+alg.String(), func(t *testing.T) {
				t.Parallel()
				conformance.ModelDifferential(t, modelTarget(topo.client), alg, rand.NewPCG(s, uint64(alg)), *modelSteps)
			})
		}
	}
}

// TestModelEnds runs the model at the corners of the input space (both ends
// of the clock, rate changes that keep a bucket's unit, amounts near 2^53),
// where Lua's doubles are closest to rounding.
func TestModelEnds(t *testing.T) {
	s := modelSeedFor(t)
	for _, alg := range tollgate.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			conformance.ModelEnds(t, modelTarget(standalone), alg, rand.NewPCG(s, uint64(alg)), *modelSteps)
		})
	}
}

// TestModelLogTime runs the sliding window log at its largest rates and
// costs on the standalone server with every command in SLOWLOG, and bounds
// the Redis time its decisions take: the median under a millisecond, nine
// in ten under five (the machine may be busy; a decision that does work in
// proportion to more than the limit's rate is slower than that every time).
func TestModelLogTime(t *testing.T) {
	ctx := context.Background()
	rdb := server.Client(t)
	old, err := rdb.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for k, v := range old {
			rdb.ConfigSet(context.Background(), k, v)
		}
	})
	for k, v := range map[string]string{"slowlog-log-slower-than": "0", "slowlog-max-len": "100000"} {
		if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	// The calls of the differential, without the model: this test is about
	// time, and runs whatever the store decides.
	clock := conformance.NewClock()
	store := redisstore.New(rdb, redisstore.WithClock(clock.Now))
	gen := conformance.NewGen(tollgate.SlidingWindowLog, rand.NewPCG(7, 7))
	prefix := fmt.Sprintf("logtime:%d:", rand.Int64())
	for i := 0; i < 1000; i++ {
		c := gen.Next()
		clock.Set(time.UnixMicro(c.Now).Sub(conformance.T0))
		r, err := store.AllowN(ctx, fmt.Sprint(prefix, c.Key), c.Limit, c.N)
		if err != nil && !errors.Is(err, tollgate.ErrCostExceedsBurst) {
			t.Fatal(err)
		}
		gen.Saw(r)
	}
	entries, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var (
		took    []time.Duration
		slowest redis.SlowLog
	)
	for _, e := range entries {
		if len(e.Args) > 6 && strings.HasPrefix(strings.ToUpper(e.Args[0]), "EVAL") && strings.Contains(e.Args[3], "{"+prefix) {
			took = append(took, e.Duration)
			if e.Duration > slowest.Duration {
				slowest = e
			}
		}
	}
	if len(took) < 100 {
		t.Fatalf("SLOWLOG holds %d log decisions, want every one of them", len(took))
	}
	slices.Sort(took)
	median, p90, worst := took[len(took)/2], took[len(took)*9/10], took[len(took)-1]
	t.Logf("%d log decisions: median %v, 90th percentile %v, slowest %v (rate %s, cost %s)", len(took), median, p90, worst, slowest.Args[4], slowest.Args[6])
	if median > time.Millisecond || p90 > 5*time.Millisecond {
		t.Errorf("log decisions take %v (median), %v (90th percentile) of Redis time, want under 1ms and 5ms", median, p90)
	}
}

// TestModelRealTime: decisions, reservations and settles on the Redis
// server's clock, the keys left to their TTLs, against the model at the
// instant of each call. Redis expires a key in real time, lazily or by its
// active expiry, a millisecond or less after its state has.
func TestModelRealTime(t *testing.T) {
	s := modelSeedFor(t)
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
	}{{"standalone", standalone}, {"cluster", clustered}} {
		target := conformance.RealTimeTarget{
			New: func(tb testing.TB) tollgate.Settler { return redisstore.New(topo.client(tb.(*testing.T))) },
			SettleAt: func(ctx context.Context, s tollgate.Settler, key string, l tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, int64, error) {
				return redisstore.SettleAt(ctx, s.(*redisstore.Store), key, l, at, reserved, actual)
			},
		}
		for _, alg := range tollgate.Algorithms() {
			t.Run(topo.name+"/"+alg.String(), func(t *testing.T) {
				t.Parallel()
				conformance.ModelRealTime(t, target, alg, rand.NewPCG(s, uint64(alg)), *modelSteps)
			})
		}
	}
}

func TestModelCases(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
	}{{"standalone", standalone}, {"cluster", clustered}} {
		t.Run(topo.name, func(t *testing.T) {
			conformance.RunModelCases(t, modelTarget(topo.client))
		})
	}
}

// TestModelCalendar: calendar windows against the model on a standalone
// server and a Cluster, across Berlin's DST changes of 2027 and the
// Februaries of 2027 and 2028.
func TestModelCalendar(t *testing.T) {
	s := modelSeedFor(t)
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
	}{{"standalone", standalone}, {"cluster", clustered}} {
		for _, alg := range []tollgate.Algorithm{tollgate.FixedWindow, tollgate.SlidingWindowCounter} {
			t.Run(topo.name+"/"+alg.String(), func(t *testing.T) {
				t.Parallel()
				conformance.ModelCalendar(t, modelTarget(topo.client), alg, rand.NewPCG(s, 0xca1+uint64(alg)), 4**modelSteps)
			})
		}
	}
}
