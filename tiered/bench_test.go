package tiered_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
)

// BenchmarkOverLimit measures a request of a key over its limit: what an
// abusive client costs, per request, over each global store, with and
// without the denial cache.
func BenchmarkOverLimit(b *testing.B) {
	for _, g := range []struct {
		name string
		new  func(now func() time.Time) tollgate.Store
	}{
		{"memory", func(now func() time.Time) tollgate.Store { return memorystore.New(memorystore.WithClock(now)) }},
		{"redis", func(now func() time.Time) tollgate.Store {
			return redisstore.New(server.Client(b), redisstore.WithClock(now))
		}},
	} {
		for _, tc := range []struct {
			alg   tollgate.Algorithm
			cache bool
		}{{tollgate.TokenBucket, false}, {tollgate.TokenBucket, true}, {tollgate.GCRA, false}, {tollgate.GCRA, true}} {
			alg := tc.alg
			b.Run(fmt.Sprintf("%s/%s/cache=%v", g.name, alg, tc.cache), func(b *testing.B) {
				clock := conformance.NewClock()
				opts := []tiered.Option{tiered.WithClock(clock.Now), untimed}
				if tc.cache {
					opts = append(opts, tiered.WithDenialCache())
				}
				s := tiered.New(g.new(clock.Now), opts...)
				limit := tollgate.Limit{Algorithm: alg, Rate: 10, Period: time.Minute, Burst: 10}
				ctx, k := context.Background(), key(b)
				for range limit.Burst {
					if _, err := s.AllowN(ctx, k, limit, 1); err != nil {
						b.Fatal(err)
					}
				}
				before := s.Stats().GlobalCalls
				for b.Loop() {
					if res, err := s.AllowN(ctx, k, limit, 1); err != nil || res.Allowed {
						b.Fatalf("%+v, %v; want a denial", res, err)
					}
				}
				b.ReportMetric(float64(s.Stats().GlobalCalls-before)/float64(b.N), "global-calls/op")
			})
		}
	}
}
