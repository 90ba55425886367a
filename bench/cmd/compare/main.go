// Command compare measures tollgate against peer rate limiters side by side,
// in one run, on one redis-server it starts itself, and prints markdown
// tables: decisions per second, latency percentiles, allocations per
// decision, the Redis server's CPU time and commands per decision, and the
// ratio of each tollgate row to each peer, and last, each path against its
// goal (goals.go).
//
//	cd bench && go run ./cmd/compare            # everything, about 2.5 minutes
//	go run ./cmd/compare -only 'token_bucket|redis_rate' -d 2s
//
// Redis rows: 64 goroutines in a closed loop over 10,000 keys, one go-redis
// client each (PoolSize 64) on loopback. Memory rows: Go benchmarks over
// 100,000 live keys (-mem-keys), serially and in the parallel shape
// (GOMAXPROCS goroutines), reported as ns/op and allocs/op. Middleware
// rows: tollgate's httplimit against sethvargo/go-limiter's httplimit and
// go-chi/httprate, serving in-process requests from 10,000 client
// addresses (-mw-ips), timed as the in-memory rows are.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/bench/internal/redisproc"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var (
		d          = fs.Duration("d", 3*time.Second, "measured span of each Redis row, over all rounds")
		rounds     = fs.Int("rounds", 3, "rounds: each Redis row is measured d/rounds in each")
		warmup     = fs.Duration("warmup", 500*time.Millisecond, "warm-up before each Redis row")
		goroutines = fs.Int("g", 64, "goroutines of the Redis rows")
		nkeys      = fs.Int("keys", 10_000, "keys of the Redis rows")
		memKeys    = fs.Int("mem-keys", 100_000, "keys of the in-memory rows")
		only       = fs.String("only", "", "run only the rows whose name matches this regexp")
		window     = fs.Duration("pipe-window", time.Millisecond, "the window of the pipelined rows (redisstore.New's default: 1ms)")
		batch      = fs.Int("pipe-batch", 64, "the batch of the pipelined rows (redisstore.New's default: 64)")
		noMem      = fs.Bool("no-memory", false, "skip the in-memory rows")
		noMW       = fs.Bool("no-middleware", false, "skip the HTTP middleware rows")
		mwIPs      = fs.Int("mw-ips", 10_000, "client addresses of the middleware rows")
		cpuprofile = fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	filter, err := regexp.Compile(*only)
	if err != nil {
		return err
	}
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	ctx := context.Background()

	fmt.Fprintf(out, "## Run of %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(out, "%s\n\n", machine(ctx, admin))
	fmt.Fprintf(out, "`go run ./cmd/compare %s`\n\n", strings.Join(args, " "))

	// Rounds interleave the rows, so that a change in what else runs on the
	// machine falls on all of them alike.
	rows := filterRows(redisRows(*window, *batch), filter)
	redisRes := make([]result, len(rows))
	for round := range *rounds {
		for i, r := range rows {
			f, err := measureRedis(ctx, srv, admin, r, fmt.Sprintf("b%d:", i), *goroutines, *nkeys, *warmup, *d/time.Duration(*rounds))
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d %-60s %10.0f/s\n", round+1, r.name, f.perSecond())
			redisRes[i].row = r
			redisRes[i].f.add(f)
		}
	}
	var verdicts goals
	if len(redisRes) > 0 {
		verdicts.redis(redisRes)
		fmt.Fprintf(out, "### Redis-backed: %d goroutines, %d keys, one redis-server on loopback\n\n", *goroutines, *nkeys)
		table(out, redisRes, true)
		ratios(out, redisRes)
	}

	if !*noMem {
		if rows := filterRows(memoryRows(), filter); len(rows) > 0 {
			res, err := memoryTables(out, rows, *rounds, *memKeys)
			if err != nil {
				return err
			}
			verdicts.memory(res)
		}
	}
	if !*noMW {
		var rows []mwRow
		for _, r := range middlewareRows() {
			if filter.MatchString(r.name) {
				rows = append(rows, r)
			}
		}
		if len(rows) > 0 {
			res, err := middlewareTables(out, rows, *rounds, *mwIPs)
			if err != nil {
				return err
			}
			verdicts.middleware(res)
		}
	}
	verdicts.print(out)
	return nil
}

func filterRows(rows []row, re *regexp.Regexp) []row {
	var out []row
	for _, r := range rows {
		if re.MatchString(r.name) {
			out = append(out, r)
		}
	}
	return out
}

type result struct {
	row
	f figures
}

// measureRedis runs one Redis row with a client of its own and reads the
// server's CPU time and command count around the measured span.
func measureRedis(ctx context.Context, srv *redisproc.Server, admin *redis.Client, r row, prefix string, g, nkeys int, warmup, d time.Duration) (figures, error) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: g})
	defer rdb.Close()
	var sent, trips atomic.Int64
	rdb.AddHook(countHook{&sent, &trips})
	dec, err := r.build(rdb)
	if err != nil {
		return figures{}, err
	}
	var cpu0, self0, exec0 time.Duration
	var cmds0, trips0 int64
	var f figures
	var markErr error
	mark := func(start bool) {
		cpu, err := srv.CPU()
		exec, err2 := commandTime(ctx, admin)
		if err == nil {
			err = err2
		}
		if err != nil {
			markErr = err
		}
		if start {
			cpu0, cmds0, trips0, self0, exec0 = cpu, sent.Load(), trips.Load(), selfCPU(), exec
		} else {
			f.redisCPU, f.cmds, f.trips, f.clientCPU, f.redisExec = cpu-cpu0, sent.Load()-cmds0, trips.Load()-trips0, selfCPU()-self0, exec-exec0
		}
	}
	g2 := closedLoop(g, keys(prefix, nkeys), warmup, d, dec, mark)
	g2.redisCPU, g2.cmds, g2.trips, g2.clientCPU, g2.redisExec = f.redisCPU, f.cmds, f.trips, f.clientCPU, f.redisExec
	if markErr != nil {
		return g2, markErr
	}
	if g2.errors > 0 {
		return g2, fmt.Errorf("%d decisions failed", g2.errors)
	}
	return g2, nil
}

// commandTime is the time the server has spent running scripts, from INFO
// commandstats: the usec of EVALSHA, EVAL and FCALL (every Redis-backed row
// here decides in a script or a function; their inner calls are inside that time, and
// are also listed on their own, so they are not added). It leaves out what
// the server spends reading and writing the network, which the /proc CPU
// time includes.
func commandTime(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var usec int64
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" && name != "cmdstat_fcall" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, err
				}
				usec += n
			}
		}
	}
	return time.Duration(usec) * time.Microsecond, nil
}

// countHook counts the commands a client sends (a pipeline's one by one).
type countHook struct{ n, trips *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

// selfCPU is the CPU time this process has used (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func table(out io.Writer, rs []result, redisCols bool) {
	if redisCols {
		fmt.Fprintln(out, "| limiter | decisions/s | p50 | p99 | p99.9 | allocs/op | Redis CPU/decision | Redis script time/decision | client CPU/decision | Redis cmds/decision | cmds/round trip | note |")
		fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	} else {
		fmt.Fprintln(out, "| limiter | decisions/s | ns/op | p50 | p99 | p99.9 | allocs/op | note |")
		fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	}
	for _, r := range rs {
		f := &r.f
		allocs := float64(f.mallocs) / float64(f.ops)
		if redisCols {
			perTrip := 0.0
			if f.trips > 0 {
				perTrip = float64(f.cmds) / float64(f.trips)
			}
			fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %.1f | %s | %s | %s | %.3f | %.1f | %s |\n", r.name, thousands(f.perSecond()),
				lat(f.pct(0.5)), lat(f.pct(0.99)), lat(f.pct(0.999)), allocs, lat(f.perOp(f.redisCPU)), lat(f.perOp(f.redisExec)), lat(f.perOp(f.clientCPU)),
				float64(f.cmds)/float64(f.ops), perTrip, r.note)
		} else {
			fmt.Fprintf(out, "| %s | %s | %.0f | %s | %s | %s | %.0f | %s |\n", r.name, thousands(f.perSecond()),
				float64(f.elapsed.Nanoseconds())/float64(f.ops), lat(f.pct(0.5)), lat(f.pct(0.99)), lat(f.pct(0.999)), allocs, r.note)
		}
	}
	fmt.Fprintln(out)
}

// ratios prints, for each tollgate row, its decisions/s and p99 against
// each peer's: "2.00× / 0.50×" is twice the throughput at half the p99.
func ratios(out io.Writer, rs []result) {
	ratioTable(out, rs, func(r result) (string, string) { return r.name, r.peer }, "decisions/s, p99",
		func(r, p result) (float64, float64) {
			return r.f.perSecond() / p.f.perSecond(), float64(r.f.pct(0.99)) / float64(p.f.pct(0.99))
		})
}

// ratioTable prints a markdown table of each tollgate row (those whose
// peer name is empty) against each peer row: the two ratios cell gives,
// under the column heading "vs <peer>: <what>".
func ratioTable[R any](out io.Writer, rs []R, names func(R) (name, peer string), what string, cell func(ours, peer R) (float64, float64)) {
	var peers, ours []R
	for _, r := range rs {
		if _, peer := names(r); peer != "" {
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
		_, peer := names(p)
		fmt.Fprintf(out, " vs %s: %s |", peer, what)
	}
	fmt.Fprint(out, "\n| --- |")
	for range peers {
		fmt.Fprint(out, " ---: |")
	}
	fmt.Fprintln(out)
	for _, r := range ours {
		name, _ := names(r)
		fmt.Fprintf(out, "| %s |", name)
		for _, p := range peers {
			a, b := cell(r, p)
			fmt.Fprintf(out, " %.2f×, %.2f× |", a, b)
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
}

func lat(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d.Nanoseconds())/1e3)
	default:
		return fmt.Sprintf("%.2fms", float64(d.Nanoseconds())/1e6)
	}
}

func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// machine describes where the run happened.
func machine(ctx context.Context, rdb *redis.Client) string {
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
		f.Close()
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	version := "?"
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
				version = v
			}
		}
	}
	return fmt.Sprintf("Machine: %d CPUs (%s), GOMAXPROCS %d, %s, Redis %s on loopback, load average at start %s.",
		runtime.NumCPU(), cpu, runtime.GOMAXPROCS(0), runtime.Version(), version, load)
}
