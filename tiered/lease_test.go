package tiered_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
)

// globalStores are the global stores the lease tests run against, on a
// settable clock: a memorystore, and redisstore on real Redis, its keys
// kept while that clock stands still (lasting).
func globalStores() []struct {
	name string
	new  func(t *testing.T, now func() time.Time) tollgate.Store
} {
	return []struct {
		name string
		new  func(t *testing.T, now func() time.Time) tollgate.Store
	}{
		{"memory", func(_ *testing.T, now func() time.Time) tollgate.Store {
			return memorystore.New(memorystore.WithClock(now))
		}},
		{"redis", func(t *testing.T, now func() time.Time) tollgate.Store {
			return redisstore.New(lasting(t), redisstore.WithClock(now))
		}},
	}
}

// gate holds the first calls to a global store until all of them have
// arrived, so that they are in flight together: what concurrent requests of
// one instance do when the global store is a round trip away.
type gate struct {
	tollgate.Store
	held    int64
	calls   atomic.Int64
	arrived sync.WaitGroup
}

func newGate(s tollgate.Store, held int) *gate {
	g := &gate{Store: s, held: int64(held)}
	g.arrived.Add(held)
	return g
}

func (g *gate) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	if g.calls.Add(1) <= g.held {
		g.arrived.Done()
		g.arrived.Wait()
	}
	return g.Store.AllowN(ctx, key, limit, n)
}

// admitAll sends requests of cost 1 to s at one instant until one is
// denied, and returns how many were admitted.
func admitAll(t *testing.T, s tollgate.Store, key string, limit tollgate.Limit) int {
	t.Helper()
	for n := 0; n < 10_000; n++ {
		res, err := s.AllowN(context.Background(), key, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			return n
		}
	}
	t.Fatal("10,000 requests admitted at one instant")
	return 0
}

// TestConcurrentLeaseTakes: concurrent requests of one instance must not
// leave it holding more than one lease's worth, or the documented bound
// (burst + instances × K at any instant) breaks; nor take tokens from the
// global store that nobody will spend. Eight cold requests arrive together
// with leases of 10: one takes a lease, the others their own cost; at the
// next instant the bucket is full again and the instance may admit its
// burst plus at most K.
func TestConcurrentLeaseTakes(t *testing.T) {
	t.Parallel()
	const rate, k, concurrent = 100, 10, 8
	limit := tollgate.Limit{Rate: rate, Period: time.Second, Burst: rate}
	for _, g := range globalStores() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			clock := conformance.NewClock()
			global := newGate(g.new(t, clock.Now), concurrent)
			s := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithLeases(k, time.Second), untimed)
			key := key(t)
			var wg sync.WaitGroup
			for range concurrent {
				wg.Go(func() {
					if res, err := s.AllowN(context.Background(), key, limit, 1); err != nil || !res.Allowed {
						t.Errorf("cold request: %+v, %v", res, err)
					}
				})
			}
			wg.Wait()
			if got, want := global.calls.Load(), int64(concurrent); got != want {
				t.Fatalf("%d global calls for %d concurrent cold requests, want %d", got, concurrent, want)
			}
			// One of them takes a lease, the others only their own cost:
			// nothing is taken that nobody can spend.
			res, err := global.Store.AllowN(context.Background(), key, limit, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.Remaining, rate-k-(concurrent-1); got != want {
				t.Errorf("global store's Remaining after the cold requests: %d, want %d", got, want)
			}
			clock.Set(999 * time.Millisecond) // the bucket is full again; the leases still hold
			if got, most := admitAll(t, s, key, limit), rate+k; got > most {
				t.Errorf("admitted %d at one instant, want at most burst + instances × K = %d", got, most)
			}
		})
	}
}

// TestLeaseBeforeDenial: a denial remembered for a large request must not
// hide the tokens the instance's lease already holds; small requests spend
// them, as the global store alone would admit them.
func TestLeaseBeforeDenial(t *testing.T) {
	t.Parallel()
	limit := tollgate.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	costs := []int{1, 10, 1, 1, 1}
	for _, g := range globalStores() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			clock := conformance.NewClock()
			global := g.new(t, clock.Now)
			s := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithDenialCache(), tiered.WithLeases(10, time.Minute), untimed)
			plain := memorystore.New(memorystore.WithClock(clock.Now))
			key := key(t)
			for i, n := range costs {
				got, err := s.AllowN(context.Background(), key, limit, n)
				if err != nil {
					t.Fatal(err)
				}
				want, err := plain.AllowN(context.Background(), key, limit, n)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allowed != want.Allowed {
					t.Errorf("request %d (cost %d): Allowed %v, the plain store says %v", i, n, got.Allowed, want.Allowed)
				}
			}
		})
	}
}
