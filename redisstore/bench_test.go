package redisstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/redisstore"
)

// BenchmarkAllow: decisions over 10,000 keys, Redis server time, on the
// package's standalone redis-server, by a store made as New makes it
// (pipelined) and one with pipelining off, each from one goroutine (a
// decision alone: the same call either way) and from 64 (gathered into
// pipelines, or a round trip each). Besides ns/op it reports cpu-ns/op,
// the CPU time of this process (the client: redis-server is another) per
// decision, which is what pipelining's own work costs a service, and
// mallocs/op, allocs/op unrounded: a batch's allocations are shared by its
// decisions, so a pipelined decision's count is fractional.
//
//	go test -run '^$' -bench Allow -benchmem ./redisstore/
func BenchmarkAllow(b *testing.B) {
	const nkeys = 10_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "bench:" + strconv.Itoa(i)
	}
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	// A deadline, as the middleware sets: a decision alone then goes from
	// its caller's goroutine.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, mode := range []struct {
		name string
		opts []redisstore.Option
	}{{"default", nil}, {"unpipelined", []redisstore.Option{redisstore.WithPipeline(0, 0)}}} {
		s := redisstore.New(rdb, mode.opts...)
		if err := s.Load(ctx); err != nil {
			b.Fatal(err)
		}
		for _, g := range []int{1, 64} {
			for _, a := range tollgate.Algorithms() {
				limit := tollgate.Limit{Algorithm: a, Rate: 1000, Period: time.Second, Burst: 1000}
				b.Run(mode.name+"/g="+strconv.Itoa(g)+"/"+a.String(), func(b *testing.B) {
					b.ReportAllocs()
					start := cpuTime(b)
					var m0 runtime.MemStats
					runtime.ReadMemStats(&m0)
					defer func() {
						var m1 runtime.MemStats
						runtime.ReadMemStats(&m1)
						b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(b.N), "mallocs/op")
						b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
					}()
					if g == 1 {
						for i := range b.N {
							if _, err := s.AllowN(ctx, keys[i%nkeys], limit, 1); err != nil {
								b.Fatal(err)
							}
						}
						return
					}
					var seq atomic.Uint64
					b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
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
	}
}

// cpuTime returns the CPU time, user and system, this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
