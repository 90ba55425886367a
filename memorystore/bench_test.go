package memorystore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

// benchLimits admit every decision of a run, and no key's state expires
// during one (a bucket refills a token every 36 s and holds 100,000; a
// window is an hour long), so the benchmark measures decisions on existing
// keys — the steady state of a busy service — not keys coming and going.
func benchLimits() []tollgate.Limit {
	var out []tollgate.Limit
	for _, a := range tollgate.Algorithms() {
		l := tollgate.Limit{Algorithm: a, Rate: 100, Period: time.Hour, Burst: 100_000}
		switch a {
		case tollgate.FixedWindow, tollgate.SlidingWindowCounter:
			l.Rate = 1_000_000
		case tollgate.SlidingWindowLog:
			l.Rate = tollgate.MaxLogRate
		}
		out = append(out, l)
	}
	return out
}

// BenchmarkAllow: decisions on 100,000 existing keys from all CPUs.
//
//	go test -run '^$' -bench . -benchmem ./memorystore/
func BenchmarkAllow(b *testing.B) {
	const nkeys = 100_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	ctx := context.Background()
	for _, limit := range benchLimits() {
		b.Run(limit.Algorithm.String(), func(b *testing.B) {
			s := memorystore.New()
			for _, k := range keys {
				if _, err := s.AllowN(ctx, k, limit, 1); err != nil {
					b.Fatal(err)
				}
			}
			var seq atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := seq.Add(7919) // each goroutine starts somewhere else
				for pb.Next() {
					i += 7919 // a prime stride walks all keys
					if _, err := s.AllowN(ctx, keys[i%nkeys], limit, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestZeroAllocs: a decision on a key that exists allocates nothing.
func TestZeroAllocs(t *testing.T) {
	ctx := context.Background()
	s := memorystore.New()
	for _, limit := range benchLimits() {
		if _, err := s.AllowN(ctx, "k", limit, 1); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := s.AllowN(ctx, "k", limit, 1); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per decision, want 0", limit.Algorithm, allocs)
		}
	}
}

// BenchmarkLimiterAllow: what an application's Limiter.Allow costs on this
// store, token bucket, 100,000 existing keys visited by a prime stride (not
// in the order they were made, which often is their order in memory), from
// one goroutine and from all CPUs. Every call is admitted.
//
//	go test -run '^$' -bench LimiterAllow -benchmem ./memorystore/
func BenchmarkLimiterAllow(b *testing.B) {
	const nkeys = 100_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	ctx := context.Background()
	limit := benchLimits()[0]
	l := tollgate.New(memorystore.New())
	for _, k := range keys {
		if _, err := l.Allow(ctx, k, limit); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for range b.N {
			if i += 7919; i >= nkeys {
				i -= nkeys
			}
			if r, err := l.Allow(ctx, keys[i], limit); err != nil || !r.Allowed {
				b.Fatal(r, err)
			}
		}
	})
	b.Run("one key", func(b *testing.B) {
		// A limit never reached: the decision's own cost, its state in
		// the CPU's cache.
		limit := tollgate.PerSecond(1_000_000_000_000)
		b.ReportAllocs()
		for range b.N {
			if r, err := l.Allow(ctx, "k", limit); err != nil || !r.Allowed {
				b.Fatal(r, err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var seq atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(104729) % nkeys)
			for pb.Next() {
				if i += 7919; i >= nkeys {
					i -= nkeys
				}
				if r, err := l.Allow(ctx, keys[i], limit); err != nil || !r.Allowed {
					b.Error(r, err)
					return
				}
			}
		})
	})
}

// TestZeroAllocsAlternating: limits that alternate allocate nothing, also
// two that share a slot of tollgate.CheckRequest's cache (10 and 135 per
// second do).
func TestZeroAllocsAlternating(t *testing.T) {
	ctx := context.Background()
	s := memorystore.New()
	limits := []tollgate.Limit{tollgate.PerSecond(10), tollgate.PerSecond(135), tollgate.PerMinute(60)}
	for _, l := range limits {
		if _, err := s.AllowN(ctx, "k", l, 1); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		for _, l := range limits {
			if _, err := s.AllowN(ctx, "k", l, 0); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per round of %d limits, want 0", allocs, len(limits))
	}
}
