package redisstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/redisstore"
)

// BenchmarkAllow: one decision per call (one EVALSHA round trip), 64
// goroutines over 10,000 keys, Redis server time, on the package's
// standalone redis-server.
//
//	go test -run '^$' -bench . -benchmem ./redisstore/
func BenchmarkAllow(b *testing.B) {
	const nkeys = 10_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "bench:" + strconv.Itoa(i)
	}
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), PoolSize: 64})
	defer rdb.Close()
	s := redisstore.New(rdb)
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		b.Fatal(err)
	}
	for _, a := range tollgate.Algorithms() {
		limit := tollgate.Limit{Algorithm: a, Rate: 1000, Period: time.Second, Burst: 1000}
		b.Run(a.String(), func(b *testing.B) {
			var seq atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0))) // 64 goroutines
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					if _, err := s.AllowN(ctx, keys[i%nkeys], limit, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkAllowPipelined is BenchmarkAllow with WithPipeline: the same 64
// goroutines' decisions go to Redis in batches of up to 16.
//
//	go test -run '^$' -bench Pipelined -benchmem ./redisstore/
func BenchmarkAllowPipelined(b *testing.B) {
	const nkeys = 10_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "bench:" + strconv.Itoa(i)
	}
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), PoolSize: 64})
	defer rdb.Close()
	s := redisstore.New(rdb, redisstore.WithPipeline(50*time.Microsecond, 16))
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		b.Fatal(err)
	}
	for _, a := range tollgate.Algorithms() {
		limit := tollgate.Limit{Algorithm: a, Rate: 1000, Period: time.Second, Burst: 1000}
		b.Run(a.String(), func(b *testing.B) {
			var seq atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					if _, err := s.AllowN(ctx, keys[i%nkeys], limit, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
