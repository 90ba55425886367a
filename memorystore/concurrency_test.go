package memorystore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
)

func concurrencyBackend(opts ...memorystore.Option) conformance.ConcurrencyBackend {
	return conformance.ConcurrencyBackend{
		New: func(t *testing.T, now func() time.Time) tollgate.ConcurrencyStore {
			return memorystore.New(append(opts, memorystore.WithClock(now))...)
		},
		Held: func(t *testing.T, s tollgate.ConcurrencyStore, key string, now time.Time) (int, time.Duration) {
			n, last := s.(*memorystore.Store).Held(key)
			if n == 0 {
				return 0, 0
			}
			return n, last.Sub(now)
		},
		StepsBack: true,
	}
}

func TestConcurrencyConformance(t *testing.T) {
	t.Parallel()
	conformance.RunConcurrency(t, concurrencyBackend())
}

func TestConcurrencyModel(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			conformance.ConcurrencyModel(t, concurrencyBackend(), 20_000, seed)
		})
	}
}

// TestConcurrencyGoroutines: many goroutines share max 3 slots on the
// monotonic clock; the number inside at once, counted by the test, never
// exceeds it.
func TestConcurrencyGoroutines(t *testing.T) {
	t.Parallel()
	s := memorystore.New()
	ctx := context.Background()
	const max = 3
	var inside, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 500 {
				p, res, err := s.Acquire(ctx, "export:acme", max, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Allowed {
					continue
				}
				n := inside.Add(1)
				time.Sleep(10 * time.Microsecond)
				for {
					if old := peak.Load(); n <= old || peak.CompareAndSwap(old, n) {
						break
					}
				}
				admitted.Add(1)
				inside.Add(-1)
				if err := s.Release(ctx, p); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := peak.Load(); got > max || got < 1 {
		t.Errorf("peak inside = %d, want 1..%d", got, max)
	}
	if n, _ := s.Held("export:acme"); n != 0 {
		t.Errorf("%d permits held after every one was released", n)
	}
	t.Logf("admitted %d of 8000, peak %d", admitted.Load(), peak.Load())
}

// TestConcurrencyMaxKeys: a full store reclaims keys whose permits have all
// lapsed before it evicts a live one, and counts what it evicts.
func TestConcurrencyMaxKeys(t *testing.T) {
	t.Parallel()
	clock := conformance.NewClock()
	s := memorystore.New(memorystore.WithClock(clock.Now), memorystore.WithMaxKeys(8), memorystore.WithShards(1))
	ctx := context.Background()
	for i := range 8 {
		if _, res, err := s.Acquire(ctx, fmt.Sprint("short:", i), 1, time.Second); err != nil || !res.Allowed {
			t.Fatalf("Acquire: %+v, %v", res, err)
		}
	}
	clock.Set(2 * time.Second) // every lease above has ended
	for i := range 8 {
		if _, res, err := s.Acquire(ctx, fmt.Sprint("long:", i), 1, time.Hour); err != nil || !res.Allowed {
			t.Fatalf("Acquire: %+v, %v", res, err)
		}
	}
	st := s.Stats()
	if got, want := st.ConcurrencyEvictions, uint64(0); got != want {
		t.Errorf("evictions = %d, want %d: lapsed keys must go first", got, want)
	}
	if st.ConcurrencyKeys > 8 {
		t.Errorf("keys = %d, want at most 8", st.ConcurrencyKeys)
	}
	// Now every key is live: each new one evicts one.
	for i := range 8 {
		if _, res, err := s.Acquire(ctx, fmt.Sprint("more:", i), 1, time.Hour); err != nil || !res.Allowed {
			t.Fatalf("Acquire: %+v, %v", res, err)
		}
	}
	var gone int
	for _, prefix := range []string{"long:", "more:"} {
		for i := range 8 {
			if n, _ := s.Held(fmt.Sprint(prefix, i)); n == 0 {
				gone++
			}
		}
	}
	st = s.Stats()
	if st.ConcurrencyKeys != 8 || st.ConcurrencyEvictions != 8 || gone != 8 {
		t.Errorf("stats %+v with %d live keys gone, want 8 keys, 8 evictions, 8 gone", st, gone)
	}
}

func TestConcurrencyCanceledContext(t *testing.T) {
	t.Parallel()
	s := memorystore.New()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, res, err := s.Acquire(ctx, "k", 1, time.Second)
	if !errors.Is(err, context.Canceled) || res.Allowed {
		t.Errorf("Acquire on a cancelled context: %+v, %v; want context.Canceled", res, err)
	}
}

// BenchmarkConcurrencyAcquireRelease: one Acquire and one Release per
// operation, on 10,000 keys. An Acquire allocates its permit's ID (and, for
// a key with no permits, the key's map).
func BenchmarkConcurrencyAcquireRelease(b *testing.B) {
	s := memorystore.New()
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("tenant:", i)
	}
	ctx := context.Background()
	var next atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(1) * 7919
		for pb.Next() {
			i++
			p, res, err := s.Acquire(ctx, keys[i%uint64(len(keys))], 5, time.Minute)
			if err != nil || !res.Allowed {
				b.Fatalf("%+v, %v", res, err)
			}
			if err := s.Release(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
