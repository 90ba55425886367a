package main

import (
	"fmt"
	"io"
	"strings"
)

// The goals each path is measured against, as ratios within one run: a
// ratio survives a shared machine's noise where an absolute figure does not.
const (
	// redisGoal: tollgate's token bucket as redisstore.New makes it,
	// against go-redis/redis_rate, in decisions/s, at a p99 no more than
	// redisGoalP99 of redis_rate's.
	redisGoal    = 2.5
	redisGoalP99 = 0.5
	// memGoal: memorystore's token bucket through Limiter.Allow against the
	// fastest peer, serially and in parallel, allocating nothing.
	memGoal = 1.5
	// mwGoal: the HTTP middleware against the fastest peer, serially, with
	// at most mwGoalAllocs allocations a request.
	mwGoal       = 1.2
	mwGoalAllocs = 2
)

// The rows the goals name.
const (
	redisGoalRow = "tollgate redisstore token_bucket"
	redisGoalVs  = "redis_rate"
	memGoalRow   = "tollgate memorystore token_bucket"
)

// goal is one path's standing against its goal.
type goal struct {
	path, peer, measured, want string
	met                        bool
}

// goals collects the verdicts of a run, printed last in one table.
type goals []goal

func (g *goals) add(path, peer, measured, want string, met bool) {
	*g = append(*g, goal{path, peer, measured, want, met})
}

func (g goals) print(out io.Writer) {
	if len(g) == 0 {
		return
	}
	fmt.Fprintln(out, "### Goals: each path against its peer in this run")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| path | peer | measured | goal | verdict |")
	fmt.Fprintln(out, "| --- | --- | --- | --- | --- |")
	for _, r := range g {
		verdict := "**missed**"
		if r.met {
			verdict = "met"
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s |\n", r.path, r.peer, r.measured, r.want, verdict)
	}
	fmt.Fprintln(out)
}

// redis judges the default Redis token bucket against redis_rate.
func (g *goals) redis(rs []result) {
	ours, peer := -1, -1
	for i, r := range rs {
		switch {
		case r.name == redisGoalRow:
			ours = i
		case r.peer == redisGoalVs:
			peer = i
		}
	}
	if ours < 0 || peer < 0 {
		return
	}
	o, p := &rs[ours].f, &rs[peer].f
	rate, p99 := o.perSecond()/p.perSecond(), float64(o.pct(0.99))/float64(p.pct(0.99))
	g.add("Redis token bucket as redisstore.New makes it (pipelined), 64 goroutines", rs[peer].name,
		fmt.Sprintf("%.2f× decisions/s, p99 %.2f×", rate, p99),
		fmt.Sprintf("≥ %.1f×, p99 ≤ %.2f×", redisGoal, redisGoalP99), rate >= redisGoal && p99 <= redisGoalP99)
}

// memory judges memorystore's token bucket against the fastest peer of
// each mode (by median ns/op), both over the same live keys.
func (g *goals) memory(rs []memResult) {
	ours := -1
	for i, r := range rs {
		if r.name == memGoalRow {
			ours = i
		}
	}
	if ours < 0 {
		return
	}
	for _, mode := range []struct {
		name string
		of   func(*memFigures) *chunkFigures
	}{
		{"serial", func(f *memFigures) *chunkFigures { return &f.serial }},
		{"parallel", func(f *memFigures) *chunkFigures { return &f.parallel }},
	} {
		o := mode.of(&rs[ours].f)
		fastest := -1
		for i, r := range rs {
			if r.peer != "" && !isOneKey(r.name) && (fastest < 0 || mode.of(&rs[i].f).median() < mode.of(&rs[fastest].f).median()) {
				fastest = i
			}
		}
		if fastest < 0 {
			return
		}
		ratio, allocs := o.pairedRatio(mode.of(&rs[fastest].f)), o.allocsPerOp()
		g.add(fmt.Sprintf("memorystore token bucket via Limiter.Allow, live keys, %s", mode.name), rs[fastest].name,
			fmt.Sprintf("%.2f×, %.2f allocs/op", ratio, allocs),
			fmt.Sprintf("≥ %.1f× the fastest peer, 0 allocs", memGoal), ratio >= memGoal && allocs < 0.005)
	}
}

// isOneKey reports whether a memory row decides on one key only: its
// figures are the decision's own cost, not a peer of the live-keys rows.
func isOneKey(name string) bool { return strings.HasPrefix(name, "one key:") }

// middleware judges each tollgate middleware row against the fastest peer
// (by serial ns/op).
func (g *goals) middleware(rs []mwResult) {
	fastest := -1
	for i, r := range rs {
		if r.peer != "" && (fastest < 0 || r.f.serial.median() < rs[fastest].f.serial.median()) {
			fastest = i
		}
	}
	if fastest < 0 {
		return
	}
	p := &rs[fastest]
	for _, r := range rs {
		if r.peer != "" {
			continue
		}
		ratio, allocs := r.f.serial.pairedRatio(&p.f.serial), r.f.serial.allocsPerOp()
		g.add("HTTP middleware: "+r.name+", serial", p.name,
			fmt.Sprintf("%.2f× (parallel %.2f×), %.2f allocs/op", ratio, r.f.parallel.pairedRatio(&p.f.parallel), allocs),
			fmt.Sprintf("≥ %.1f× the fastest peer, ≤ %d allocs", mwGoal, mwGoalAllocs), ratio >= mwGoal && allocs <= mwGoalAllocs)
	}
}
