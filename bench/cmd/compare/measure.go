package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
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

// memFigures are one in-memory row's measurements over all its rounds:
// serially (one goroutine) and in parallel (GOMAXPROCS goroutines).
type memFigures struct {
	serial, parallel chunkFigures
}

// mode returns the serial figures for 0, the parallel ones for 1.
func (f *memFigures) mode(m int) *chunkFigures {
	if m == 0 {
		return &f.serial
	}
	return &f.parallel
}

// chunkFigures are the ns/op of every chunk of decisions, and the
// allocations over all of them.
type chunkFigures struct {
	nsPerOp     []float64
	ops, allocs int64
}

func (c *chunkFigures) add(d chunkFigures) {
	c.nsPerOp = append(c.nsPerOp, d.nsPerOp...)
	c.ops += d.ops
	c.allocs += d.allocs
}

// median is the median chunk's ns/op: on a machine that other work
// shares, a chunk during which this process was descheduled is slow by
// however long that lasted, and the median leaves those out where a mean
// would not.
func (c *chunkFigures) median() float64 { return median(c.nsPerOp) }

// pairedRatio is the median over the chunks of p's ns/op over c's in the
// same slot: the chunks of every row in one slot ran one after another,
// within milliseconds, so what else ran on the machine then fell on both.
func (c *chunkFigures) pairedRatio(p *chunkFigures) float64 {
	r := make([]float64, min(len(c.nsPerOp), len(p.nsPerOp)))
	for i := range r {
		r[i] = p.nsPerOp[i] / c.nsPerOp[i]
	}
	return median(r)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func (c chunkFigures) allocsPerOp() float64 { return float64(c.allocs) / float64(c.ops) }

// memResult is one in-memory row and its figures.
type memResult struct {
	row
	f memFigures
}

// memoryTables measures the in-memory rows over nkeys keys each and prints
// their table and their ratios to the peers (see interleave for how the
// rows take turns).
func memoryTables(out io.Writer, rows []row, rounds, nkeys int) ([]memResult, error) {
	g := runtime.GOMAXPROCS(0)
	res := make([]memResult, len(rows))
	cs := make([][2]*chunker, len(rows)) // serial, parallel
	defer closeChunkers(cs)
	for i, r := range rows {
		decide, err := r.build(nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		// Every key holds state before anything is measured.
		ks := keys(fmt.Sprintf("m%d:", i), nkeys)
		for _, k := range ks {
			if err := decide(context.Background(), k); err != nil {
				return nil, fmt.Errorf("%s: %w", r.name, err)
			}
		}
		res[i].row = r
		for m, n := range []int{1, g} {
			cs[i][m] = newChunker(ks, func() func(context.Context, string) error { return decide }, n)
		}
	}
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = r.name
	}
	fs, err := interleave(names, cs, rounds)
	if err != nil {
		return nil, err
	}
	for i := range res {
		res[i].f = fs[i]
	}
	fmt.Fprintf(out, "### In memory: %d live keys; serial (one goroutine) and parallel (GOMAXPROCS=%d goroutines)\n\n", nkeys, g)
	fmt.Fprintf(out, "ns/op is the median of %d chunks of about %v per row and mode (parallel: wall time over all goroutines' decisions); the rows take turns chunk by chunk, and a ratio is the median of the ratios of chunks that ran side by side.\n\n", rounds*chunksPerRound, chunkTime)
	fmt.Fprintln(out, "| limiter | serial ns/op | serial allocs/op | parallel ns/op | parallel allocs/op | note |")
	fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: | --- |")
	for _, r := range res {
		fmt.Fprintf(out, "| %s | %.0f | %.2f | %.0f | %.2f | %s |\n", r.name, r.f.serial.median(), r.f.serial.allocsPerOp(),
			r.f.parallel.median(), r.f.parallel.allocsPerOp(), r.note)
	}
	fmt.Fprintln(out)
	memRatios(out, res)
	return res, nil
}

// interleave measures rows of chunkers, serial and parallel (cs[i][0] and
// cs[i][1] for the row named names[i]), and returns each row's figures.
// First the allocations, row by row (a row's own calls alone between two
// readings of the allocator's count); then the times: the rows take turns
// chunk by chunk, in each slot every row running one chunk (about
// chunkTime), in an order that rotates from slot to slot, so that a ratio
// compares chunks that ran within milliseconds of each other.
func interleave(names []string, cs [][2]*chunker, rounds int) ([]memFigures, error) {
	fs := make([]memFigures, len(cs))
	for m := range 2 {
		for i := range cs {
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			for range 12 {
				cs[i][m].chunk()
			}
			runtime.ReadMemStats(&ms1)
			f := fs[i].mode(m)
			f.ops, f.allocs = int64(12*cs[i][m].n*cs[i][m].g), int64(ms1.Mallocs-ms0.Mallocs)
		}
	}
	for round := range rounds {
		for m := range 2 {
			for slot := range chunksPerRound {
				for j := range cs {
					i := (slot + j) % len(cs)
					f := fs[i].mode(m)
					f.nsPerOp = append(f.nsPerOp, cs[i][m].chunk())
				}
			}
		}
		for i, name := range names {
			fmt.Fprintf(os.Stderr, "round %d %-60s serial %6.0f ns/op, parallel %6.0f ns/op\n", round+1, name, fs[i].serial.median(), fs[i].parallel.median())
		}
	}
	for i := range cs {
		for _, c := range cs[i] {
			if c.err() != nil {
				return nil, fmt.Errorf("%s: %w", names[i], c.err())
			}
		}
	}
	return fs, nil
}

func closeChunkers(cs [][2]*chunker) {
	for _, c := range cs {
		for _, c := range c {
			if c != nil {
				c.close()
			}
		}
	}
}

// memRatios prints, for each tollgate row, how many times faster it is than
// each peer (the peer's ns/op over its own), serially and in parallel:
// "1.50×, 1.20×" is 1.5 times as fast serially and 1.2 in parallel.
func memRatios(out io.Writer, rs []memResult) {
	ratioTable(out, rs, func(r memResult) (string, string) { return r.name, r.peer }, "serial, parallel",
		func(r, p memResult) (float64, float64) {
			return r.f.serial.pairedRatio(&p.f.serial), r.f.parallel.pairedRatio(&p.f.parallel)
		})
}

const (
	// chunkTime is about how long one chunk of decisions lasts: shorter
	// than a scheduler's time slice, so that most chunks run undisturbed.
	chunkTime = time.Millisecond
	// chunksPerRound chunks are timed per row, mode and round.
	chunksPerRound = 200
)

// chunker times chunks of decisions of about chunkTime, each with g
// goroutines deciding at once, sized by a warm-up. The goroutines walk the
// items (keys, requests) in one random order (the same for every row),
// each from a different place. Not in the order the items were made: a
// limiter's state for them, made in that order, often lies in that order
// in memory, and a walk in order, or by a constant stride, lets the CPU's
// prefetchers fetch the next key's state before it is asked for, which no
// service's traffic does. Every call must succeed: a denial is a failure
// here, as the limits admit everything.
type chunker struct {
	g, n   int
	start  []chan int
	wg     sync.WaitGroup
	mu     sync.Mutex
	failed error
}

// newChunker starts g goroutines over items, each deciding with a function
// of its own that newWorker returns (so that it can keep state a
// goroutine must not share, such as a ResponseWriter).
func newChunker[T any](items []T, newWorker func() func(context.Context, T) error, g int) *chunker {
	ctx := context.Background()
	c := &chunker{g: g, start: make([]chan int, g)}
	order := rand.New(rand.NewPCG(1, 2)).Perm(len(items))
	walk := make([]T, len(items))
	for i, k := range order {
		walk[i] = items[k]
	}
	for i := range c.start {
		c.start[i] = make(chan int)
		decide := newWorker()
		go func(j int) {
			for n := range c.start[i] {
				for range n {
					if j++; j == len(walk) {
						j = 0
					}
					if err := decide(ctx, walk[j]); err != nil {
						c.mu.Lock()
						c.failed = err
						c.mu.Unlock()
						break
					}
				}
				c.wg.Done()
			}
		}(i * len(items) / g)
	}
	c.n = 1000
	for d := c.run(c.n); d < chunkTime/2; d = c.run(c.n) {
		c.n *= 2
	}
	c.n = max(1, int(float64(c.n)*float64(chunkTime)/float64(c.run(c.n))))
	return c
}

// run makes n decisions on each of the goroutines at once and returns the
// wall time.
func (c *chunker) run(n int) time.Duration {
	c.wg.Add(c.g)
	t0 := time.Now()
	for _, s := range c.start {
		s <- n
	}
	c.wg.Wait()
	return time.Since(t0)
}

// chunk times one chunk and returns its ns per decision.
func (c *chunker) chunk() float64 {
	return float64(c.run(c.n).Nanoseconds()) / float64(c.n*c.g)
}

func (c *chunker) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

func (c *chunker) close() {
	for _, s := range c.start {
		close(s)
	}
}
