package main

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// op makes one decision on key. It returns an error only for a failure:
// a denial is not one.
type op func(ctx context.Context, key string) error

// figures are one row's measurements, as totals over its rounds.
type figures struct {
	ops     int64
	errors  int64
	elapsed time.Duration
	samples []time.Duration // every decision's latency (sorted by sort)
	mallocs uint64
	// Redis rows: the server's and this process's CPU time, commands sent
	// and round trips (a pipeline is one) over the measured spans.
	redisCPU, clientCPU time.Duration
	redisExec           time.Duration // time in scripts, from INFO commandstats
	cmds, trips         int64
}

func (f figures) perSecond() float64 { return float64(f.ops) / f.elapsed.Seconds() }

func (f figures) perOp(total time.Duration) time.Duration {
	if f.ops == 0 {
		return 0
	}
	return total / time.Duration(f.ops)
}

// add merges another round of the same row into f.
func (f *figures) add(g figures) {
	f.ops += g.ops
	f.errors += g.errors
	f.elapsed += g.elapsed
	f.samples = append(f.samples, g.samples...)
	f.mallocs += g.mallocs
	f.redisCPU += g.redisCPU
	f.redisExec += g.redisExec
	f.clientCPU += g.clientCPU
	f.cmds += g.cmds
	f.trips += g.trips
}

// pct returns the q quantile of the latencies.
func (f *figures) pct(q float64) time.Duration {
	if len(f.samples) == 0 {
		return 0
	}
	if !slices.IsSorted(f.samples) {
		slices.Sort(f.samples)
	}
	return f.samples[min(len(f.samples)-1, int(q*float64(len(f.samples))))]
}

// keys returns n keys with a prefix of their own, so rows never share state.
func keys(prefix string, n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = prefix + strconv.Itoa(i)
	}
	return k
}

// closedLoop runs g goroutines, each deciding on keys one after another as
// fast as answers come (a closed loop: the next decision waits for the
// last), for a warm-up and then for d, timing every decision.
//
// mark, when not nil, is called right before and right after the measured
// span (true, then false): for readings of the server.
func closedLoop(g int, ks []string, warmup, d time.Duration, decide op, mark func(start bool)) figures {
	ctx := context.Background()
	var (
		stop    atomic.Bool
		measure atomic.Bool
		wg      sync.WaitGroup
		errs    atomic.Int64
	)
	lat := make([][]time.Duration, g)
	for i := range g {
		lat[i] = make([]time.Duration, 0, 1<<16)
	}
	var ms0, ms1 runtime.MemStats
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := i * (len(ks) / g)
			for !stop.Load() {
				j++
				if j == len(ks) {
					j = 0
				}
				t0 := time.Now()
				err := decide(ctx, ks[j])
				t := time.Since(t0)
				if measure.Load() {
					lat[i] = append(lat[i], t)
					if err != nil {
						errs.Add(1)
					}
				}
			}
		}()
	}
	time.Sleep(warmup)
	if mark != nil {
		mark(true)
	}
	runtime.ReadMemStats(&ms0)
	start := time.Now()
	measure.Store(true)
	time.Sleep(d)
	measure.Store(false)
	elapsed := time.Since(start)
	if mark != nil {
		mark(false)
	}
	runtime.ReadMemStats(&ms1)
	stop.Store(true)
	wg.Wait()

	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	return figures{ops: int64(len(all)), errors: errs.Load(), elapsed: elapsed, samples: all, mallocs: ms1.Mallocs - ms0.Mallocs}
}

// parallel measures decide in the shape of a Go parallel benchmark
// (testing.Benchmark with RunParallel: GOMAXPROCS goroutines, no timing per
// call), which is how the in-memory peers benchmark themselves; then a
// short closed loop of as many goroutines times each call for percentiles
// (time.Now adds some tens of ns to each).
func parallel(ks []string, d time.Duration, decide op) figures {
	ctx := context.Background()
	var seq atomic.Uint64
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			j := int(seq.Add(1)) * 7919
			for pb.Next() {
				j++
				if j >= len(ks) {
					j = 0
				}
				if err := decide(ctx, ks[j]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	f := closedLoop(runtime.GOMAXPROCS(0), ks, 100*time.Millisecond, d, decide, nil)
	f.ops = int64(r.N)
	f.elapsed = r.T
	f.mallocs = r.MemAllocs
	return f
}
