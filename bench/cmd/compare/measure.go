package main

import (
	"context"
	"fmt"
	"io"
	"os"
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

// memFigures are one in-memory row's measurements, totals over its rounds:
// serially (one goroutine) and in Go's parallel benchmark shape.
type memFigures struct {
	serial, parallel benchTotals
}

type benchTotals struct {
	ops, allocs int64
	elapsed     time.Duration
}

func (t *benchTotals) add(r testing.BenchmarkResult) {
	t.ops += int64(r.N)
	t.allocs += int64(r.MemAllocs)
	t.elapsed += r.T
}

func (t benchTotals) nsPerOp() float64 { return float64(t.elapsed.Nanoseconds()) / float64(t.ops) }

func (t benchTotals) allocsPerOp() float64 { return float64(t.allocs) / float64(t.ops) }

// memResult is one in-memory row and its figures.
type memResult struct {
	row
	f memFigures
}

// memoryTables measures the in-memory rows over nkeys keys each, in rounds
// that interleave the rows, and prints their table and their ratios to the
// peers.
func memoryTables(out io.Writer, rows []row, rounds, nkeys int) error {
	decs := make([]op, len(rows))
	ks := make([][]string, len(rows))
	for i, r := range rows {
		var err error
		if decs[i], err = r.build(nil); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		// Every key holds state before anything is measured.
		ks[i] = keys(fmt.Sprintf("m%d:", i), nkeys)
		for _, k := range ks[i] {
			if err := decs[i](context.Background(), k); err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
		}
	}
	res := make([]memResult, len(rows))
	for round := range rounds {
		for i, r := range rows {
			s, p, err := benchMemory(ks[i], decs[i])
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d %-60s serial %6.0f ns/op, parallel %6.0f ns/op\n", round+1, r.name,
				float64(s.T.Nanoseconds())/float64(s.N), float64(p.T.Nanoseconds())/float64(p.N))
			res[i].row = r
			res[i].f.serial.add(s)
			res[i].f.parallel.add(p)
		}
	}
	fmt.Fprintf(out, "### In memory: %d live keys; serial (one goroutine) and Go's parallel benchmark shape (GOMAXPROCS=%d goroutines)\n\n", nkeys, runtime.GOMAXPROCS(0))
	fmt.Fprintln(out, "| limiter | serial ns/op | serial allocs/op | parallel ns/op | parallel allocs/op | note |")
	fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: | --- |")
	for _, r := range res {
		fmt.Fprintf(out, "| %s | %.0f | %.2f | %.0f | %.2f | %s |\n", r.name, r.f.serial.nsPerOp(), r.f.serial.allocsPerOp(),
			r.f.parallel.nsPerOp(), r.f.parallel.allocsPerOp(), r.note)
	}
	fmt.Fprintln(out)
	memRatios(out, res)
	return nil
}

// memRatios prints, for each tollgate row, how many times faster it is than
// each peer (the peer's ns/op over its own), serially and in parallel:
// "1.50×, 1.20×" is 1.5 times as fast serially and 1.2 in parallel.
func memRatios(out io.Writer, rs []memResult) {
	var peers, ours []memResult
	for _, r := range rs {
		if r.peer != "" {
			peers = append(peers, r)
		} else {
			ours = append(ours, r)
		}
	}
	if len(peers) == 0 || len(ours) == 0 {
		return
	}
	fmt.Fprint(out, "| tollgate row |")
	for _, p := range peers {
		fmt.Fprintf(out, " vs %s: serial, parallel |", p.peer)
	}
	fmt.Fprint(out, "\n| --- |")
	for range peers {
		fmt.Fprint(out, " ---: |")
	}
	fmt.Fprintln(out)
	for _, r := range ours {
		fmt.Fprintf(out, "| %s |", r.name)
		for _, p := range peers {
			fmt.Fprintf(out, " %.2f×, %.2f× |", p.f.serial.nsPerOp()/r.f.serial.nsPerOp(), p.f.parallel.nsPerOp()/r.f.parallel.nsPerOp())
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
}

// benchMemory measures decide as Go benchmarks do (testing.Benchmark, about
// a second each, no timing per call): serially, one goroutine walking the
// keys; then in parallel, b.RunParallel's GOMAXPROCS goroutines each
// walking them from a different place. The walk takes every stride-th key
// (a prime, so it visits them all): keys made one after another, and the
// state a limiter made for them in that order, often lie one after another
// in memory, and walking them in order would measure the CPU's prefetcher,
// not a service's traffic. Every call must succeed: a denial
// counts as a failure here, as the limits admit everything.
// stride is a prime larger than the cache line over a key's size.
const stride = 7919

func benchMemory(ks []string, decide op) (serial, parallel testing.BenchmarkResult, err error) {
	ctx := context.Background()
	var (
		mu     sync.Mutex
		failed error
	)
	fail := func(err error) {
		mu.Lock()
		failed = err
		mu.Unlock()
	}
	serial = testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		j := 0
		for range b.N {
			if j += stride; j >= len(ks) {
				j -= len(ks)
			}
			if err := decide(ctx, ks[j]); err != nil {
				fail(err)
				return
			}
		}
	})
	var seq atomic.Uint64
	parallel = testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			j := int(seq.Add(1)*104729) % len(ks)
			for pb.Next() {
				if j += stride; j >= len(ks) {
					j -= len(ks)
				}
				if err := decide(ctx, ks[j]); err != nil {
					fail(err)
					return
				}
			}
		})
	})
	return serial, parallel, failed
}
