package tiered_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/tiered"
)

// randomLimit returns a valid limit of a random algorithm, with a period
// from a few that do and do not divide a second evenly.
func randomLimit(rng *rand.Rand) tollgate.Limit {
	periods := []time.Duration{time.Second, time.Minute, 700 * time.Millisecond, 333 * time.Millisecond, 3 * time.Second, 1500 * time.Millisecond}
	for {
		l := tollgate.Limit{
			Algorithm: tollgate.Algorithms()[rng.IntN(len(tollgate.Algorithms()))],
			Rate:      1 + rng.IntN(20),
			Period:    periods[rng.IntN(len(periods))],
			Burst:     1 + rng.IntN(10),
		}
		if l.Algorithm == tollgate.LeakyBucket && rng.IntN(2) == 0 {
			l.MaxDelay = time.Duration(1+rng.IntN(1500)) * time.Millisecond
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// changed returns l with another Rate, Burst or MaxDelay: the same state
// (key, algorithm, period) under a new plan.
func changed(rng *rand.Rand, l tollgate.Limit) tollgate.Limit {
	for {
		c := randomLimit(rng)
		c.Algorithm, c.Period = l.Algorithm, l.Period
		if c.Algorithm != tollgate.LeakyBucket {
			c.MaxDelay = 0
		}
		if c.Validate() == nil {
			return c
		}
	}
}

// TestLeaseBoundUnderConcurrency: several instances, each a tiered store
// with leases and several goroutines sending at once, share one global
// store. Between any two instants they admit together at most what the
// limit admits in that span plus K per instance: burst + rate × elapsed +
// instances × K for the buckets, Rate per window for FixedWindow (whose
// leases end with their window). The clock stands still during each round
// of concurrent requests and moves forward between rounds.
func TestLeaseBoundUnderConcurrency(t *testing.T) {
	// Not parallel with the other tests: its many goroutines would slow
	// down those that hold deadlines.
	const instances, workers = 3, 4
	for _, g := range globalStores() {
		rounds, seeds := 150, uint64(4)
		if g.name == "redis" {
			rounds, seeds = 60, 2
		}
		for _, alg := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket, tollgate.FixedWindow} {
			for seed := uint64(1); seed <= seeds; seed++ {
				t.Run(fmt.Sprintf("%s/%s/%d", g.name, alg, seed), func(t *testing.T) {
					t.Parallel()
					rng := rand.New(rand.NewPCG(seed, uint64(alg)))
					// Redis counts TTLs in real time, not on the test's
					// clock: the Redis global store keeps its keys
					// (globalStores).
					limit := tollgate.Limit{Algorithm: alg, Rate: 50 + rng.IntN(200), Period: time.Minute, Burst: 5 + rng.IntN(50)}
					k := 2 + rng.IntN(10)
					refill := time.Duration(limit.Burst) * limit.Period / time.Duration(limit.Rate)
					ttl := 2*refill + rand.N(refill)
					clock := conformance.NewClock()
					global := &slowed{Store: g.new(t, clock.Now)}
					var stores []*tiered.Store
					for range instances {
						stores = append(stores, tiered.New(global, tiered.WithClock(clock.Now), tiered.WithDenialCache(), tiered.WithLeases(k, ttl),
							// No timeout and no degraded mode: a slow call on a busy
							// machine would otherwise be decided locally, at the
							// whole limit, and the bound would not be the leases'.
							tiered.WithTimeout(0), tiered.WithoutDegradedMode()))
					}
					key := key(t)
					at := make([]time.Duration, rounds)
					admitted := make([]int, rounds)
					var elapsed time.Duration
					for r := range rounds {
						switch x := rng.IntN(10); {
						case x < 3: // the same instant
						case x < 6:
							elapsed += time.Duration(rng.IntN(50_000)) * time.Microsecond
						case x < 9: // long enough to refill the bucket, not to end the leases
							elapsed += refill + time.Duration(rng.Int64N(int64(refill/2)))
						default:
							elapsed += time.Duration(rng.Int64N(int64(3 * refill)))
						}
						clock.Set(elapsed)
						at[r] = elapsed
						// A light round leaves leases with tokens in them; a
						// heavy one spends them and drains the bucket.
						most := 3 * k
						if rng.IntN(3) == 0 {
							most = 2
						}
						var mu sync.Mutex
						var wg sync.WaitGroup
						for _, s := range stores {
							for range workers {
								sends, seed := rng.IntN(most), rng.Uint64()
								wg.Go(func() {
									rng := rand.New(rand.NewPCG(seed, 1))
									for range sends {
										n := 1 + rng.IntN(min(3, limit.Capacity()))
										res, err := s.AllowN(context.Background(), key, limit, n)
										if err != nil {
											t.Error(err)
											return
										}
										if res.Allowed {
											mu.Lock()
											admitted[r] += n
											mu.Unlock()
										}
									}
								})
							}
						}
						wg.Wait()
					}
					for i, s := range stores {
						if st := s.Stats(); st.GlobalErrors != 0 || st.Degraded != 0 {
							t.Errorf("instance %d: %d global errors, %d degraded decisions", i, st.GlobalErrors, st.Degraded)
						}
					}
					checkLeaseBound(t, limit, k*instances, at, admitted)
				})
			}
		}
	}
}

// slowed is a global store whose calls take a random moment longer, so that
// the requests of one instance overlap in it as they do across a network.
type slowed struct{ tollgate.Store }

func (s *slowed) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	return s.Store.AllowN(ctx, key, limit, n)
}

// checkLeaseBound checks every span of rounds [i, j] against the bound.
func checkLeaseBound(t *testing.T, limit tollgate.Limit, held int, at []time.Duration, admitted []int) {
	t.Helper()
	total := 0
	for _, a := range admitted {
		total += a
	}
	if total == 0 {
		t.Fatal("nothing admitted")
	}
	window := func(d time.Duration) int64 {
		return int64((conformance.T0.Add(d).UnixMicro()) / int64(limit.Period/time.Microsecond))
	}
	beyond := 0 // the most admitted in a span beyond what the limit alone admits
	for i := range admitted {
		sum := 0
		for j := i; j < len(admitted); j++ {
			sum += admitted[j]
			var alone, most int
			if limit.Algorithm == tollgate.FixedWindow {
				if window(at[i]) != window(at[j]) {
					continue // spans of several windows: the per-window checks cover them
				}
				alone, most = limit.Rate, limit.Rate
			} else {
				alone = limit.Burst + int(int64(limit.Rate)*int64(at[j]-at[i])/int64(limit.Period))
				most = alone + held
			}
			beyond = max(beyond, sum-alone)
			if sum > most {
				t.Fatalf("rounds %d to %d (%v to %v): %d admitted, bound %d (%s, %d held by instances)", i, j, at[i], at[j], sum, most, limit, held)
			}
		}
	}
	t.Logf("%d admitted in %v; at most %d beyond the limit alone in a span (bound: %d)", total, at[len(at)-1], beyond, held)
}
