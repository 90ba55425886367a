package tiered_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
)

// largeLimit returns a valid limit of a random algorithm at a high rate
// over a long period, whose states count in large units: 5,532,222 per
// 24h, burst 2,900, counts a µs as 922,037 units, so that a state a clock
// step back put months ahead of the clock is more units than an int64
// holds. periods are the periods to draw from.
func largeLimit(rng *rand.Rand, periods []time.Duration) tollgate.Limit {
	for {
		l := tollgate.Limit{
			Algorithm: tollgate.Algorithms()[rng.IntN(len(tollgate.Algorithms()))],
			Rate:      100_000 + rng.IntN(9_900_000),
			Period:    periods[rng.IntN(len(periods))],
			Burst:     1 + rng.IntN(5000),
		}
		if rng.IntN(4) == 0 {
			l.Algorithm, l.Rate, l.Period, l.Burst = tollgate.GCRA, 5_532_222, 24*time.Hour, 2900
		}
		if l.Algorithm == tollgate.LeakyBucket && rng.IntN(2) == 0 {
			l.MaxDelay = time.Duration(1+rng.IntN(3600)) * time.Second
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// exactRun is one random run of TestLocalAnswersExact.
type exactRun struct {
	steps int
	// changes lets the run change a live key's limit.
	changes bool
	// limit returns a random limit.
	limit func(rng *rand.Rand) tollgate.Limit
	// stores returns the global store under the tiered one, and the plain
	// store compared with it, both on now.
	stores func(t *testing.T, now func() time.Time) (global, plain tollgate.Store)
	// key is the plain store's key for a key of the tiered one.
	plainKey func(string) string
}

// TestLocalAnswersExact drives a tiered store (denial cache only) and a
// plain store with the same random requests — random algorithms, limits and
// costs, plan changes on live keys, a clock that stands still, steps
// forward and steps back, by seconds or by months — and requires every
// answer to be the plain store's, field by field; a denial answered
// locally must also be what the global store answers at that instant.
func TestLocalAnswersExact(t *testing.T) {
	// Not parallel with the other tests: it would slow down those that
	// hold deadlines.
	memory := exactRun{
		steps:   20_000,
		changes: true,
		limit: func(rng *rand.Rand) tollgate.Limit {
			if rng.IntN(3) == 0 {
				return largeLimit(rng, []time.Duration{24 * time.Hour, time.Hour, time.Second})
			}
			return randomLimit(rng)
		},
		stores: func(_ *testing.T, now func() time.Time) (tollgate.Store, tollgate.Store) {
			return memorystore.New(memorystore.WithClock(now)), memorystore.New(memorystore.WithClock(now))
		},
		plainKey: func(k string) string { return k },
	}
	// The same on Redis, whose stores keep their keys (redisStores):
	// Redis counts TTLs in real time, which the clock here does not follow.
	redis := exactRun{
		steps:    3000,
		changes:  true,
		limit:    memory.limit,
		stores:   redisStores,
		plainKey: func(k string) string { return "plain:" + k },
	}
	for _, tc := range []struct {
		name  string
		seeds uint64
		run   exactRun
	}{{"memory", 6, memory}, {"redis", 2, redis}} {
		for seed := uint64(1); seed <= tc.seeds; seed++ {
			t.Run(fmt.Sprintf("%s/%d", tc.name, seed), func(t *testing.T) {
				t.Parallel()
				tc.run.check(t, rand.New(rand.NewPCG(seed, 0x7165726564)))
			})
		}
	}
}

// redisStores returns the global and the plain store of
// TestLocalAnswersExact's Redis half, both on now, on a client that keeps
// every key they write (lasting): their answers follow now alone.
func redisStores(t *testing.T, now func() time.Time) (global, plain tollgate.Store) {
	c := lasting(t)
	return redisstore.New(c, redisstore.WithClock(now)), redisstore.New(c, redisstore.WithClock(now))
}

// TestRedisStoresPause: the stores of TestLocalAnswersExact's Redis half
// decide by the test's clock alone, however much real time passes between
// two calls at one instant of it (a busy machine's pause): a bucket that
// one request emptied, full again 1ms later on that clock, is still empty
// 20ms later in real time.
func TestRedisStoresPause(t *testing.T) {
	t.Parallel()
	clock := conformance.NewClock()
	ctx := context.Background()
	limit := tollgate.Limit{Rate: 1000, Period: time.Second, Burst: 1}
	global, plain := redisStores(t, clock.Now)
	for name, store := range map[string]tollgate.Store{"global": global, "plain": plain} {
		k := key(t)
		if res, err := store.AllowN(ctx, k, limit, 1); err != nil || !res.Allowed || res.ResetAfter != time.Millisecond {
			t.Fatalf("%s store, first request: %+v, %v; want admitted, full again in 1ms", name, res, err)
		}
		time.Sleep(20 * time.Millisecond)
		if res, err := store.AllowN(ctx, k, limit, 1); err != nil || res.Allowed || res.RetryAfter != time.Millisecond {
			t.Errorf("%s store, at the same instant 20ms later in real time: %+v, %v; want denied, retry in 1ms", name, res, err)
		}
	}
}

func (r exactRun) check(t *testing.T, rng *rand.Rand) {
	clock := conformance.NewClock()
	global, plain := r.stores(t, clock.Now)
	// No timeout and no degraded mode: on a busy machine a call that
	// outlasted the timeout would be decided by the degraded-mode store,
	// which is not what this test compares.
	s := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithDenialCache(), tiered.WithTimeout(0), tiered.WithoutDegradedMode())
	ctx := context.Background()
	type state struct {
		key   string
		limit tollgate.Limit
	}
	prefix := key(t)
	live := make([]state, 6)
	for i := range live {
		live[i] = state{fmt.Sprintf("%s:k%d", prefix, i%3), r.limit(rng)}
	}
	var at time.Duration
	begin := time.Now()
	for i := 0; i < r.steps; i++ {
		at = exactStep(rng, at)
		clock.Set(at)
		st := &live[rng.IntN(len(live))]
		switch x := rng.IntN(100); {
		case x < 3 && r.changes:
			st.limit = changed(rng, st.limit)
		case x < 4:
			st.limit = r.limit(rng) // another algorithm or period: another state
		case x < 5:
			if err := s.Reset(ctx, st.key, st.limit); err != nil {
				t.Fatal(err)
			}
			if err := plain.Reset(ctx, r.plainKey(st.key), st.limit); err != nil {
				t.Fatal(err)
			}
			continue
		}
		n := rng.IntN(st.limit.Capacity() + 1)
		if rng.IntN(2) == 0 {
			n = min(1+rng.IntN(3), n) // small costs most of the time: what gets denied locally
		}
		want, werr := plain.AllowN(ctx, r.plainKey(st.key), st.limit, n)
		before := s.Stats().LocalDenials
		got, gerr := s.AllowN(ctx, st.key, st.limit, n)
		if werr != nil || gerr != nil {
			t.Fatalf("step %d: %s n %d: errors %v and %v", i, st.limit, n, gerr, werr)
		}
		local := s.Stats().LocalDenials != before
		if got != want {
			t.Fatalf("step %d at %v: %s key %s n %d (local %v):\ntiered %+v\nplain  %+v", i, at, st.limit, st.key, n, local, got, want)
		}
		if local {
			// A denial changes nothing: asking the global store is harmless.
			g, err := global.AllowN(ctx, st.key, st.limit, n)
			if err != nil || g != got {
				t.Fatalf("step %d at %v: %s key %s n %d:\nlocal  %+v\nglobal %+v (%v)", i, at, st.limit, st.key, n, got, g, err)
			}
		}
	}
	st := s.Stats()
	t.Logf("%d steps in %v: %d global calls, %d denials answered locally", r.steps, time.Since(begin).Round(time.Millisecond), st.GlobalCalls, st.LocalDenials)
	if st.LocalDenials == 0 {
		t.Errorf("no denial answered locally: the test does not exercise the cache")
	}
}

// exactStep moves the clock at: it stands still, steps forward or back by
// up to seconds, and now and then by up to 400 days, within ten years of
// the start.
func exactStep(rng *rand.Rand, at time.Duration) time.Duration {
	const day, most = 24 * time.Hour, 3650 * 24 * time.Hour
	switch r := rng.IntN(200); {
	case r < 80: // the clock stands still
	case r < 150:
		at += time.Duration(rng.IntN(50_000)) * time.Microsecond
	case r < 180:
		at += time.Duration(rng.IntN(3000)) * time.Millisecond
	case r < 192:
		at -= time.Duration(rng.IntN(2000)) * time.Millisecond // NTP, a VM resumed
	case r < 194:
		at += time.Duration(rng.IntN(120)) * time.Second
	case r < 197:
		at -= time.Duration(rng.Int64N(int64(400 * day))) // a clock set far back, then set right
	default:
		at += time.Duration(rng.Int64N(int64(400 * day)))
	}
	return min(max(at, -most), most)
}
