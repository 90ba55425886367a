package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/redisstore"
)

// RaceLimit is the race demo's bucket: 20 tokens per second, burst 100.
var RaceLimit = tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 20, Period: time.Second, Burst: 100}

// raceFirst is what the first call takes from the full bucket before the
// processes race for the rest. Leaving little keeps the bucket from filling
// up to its capacity again during the race (90 tokens take 4.5 s), so no
// refill is lost to the cap and the count is exact: burst + refill.
const raceFirst = 90

// Race modes: which limiter a worker process hammers.
const (
	// RaceNaive is a token bucket decided in Go between a read and a write:
	// TIME and HMGET, then HSET — GET, compare, SET — on a hash of its own.
	RaceNaive = "naive"
	// RaceLua is redisstore's token bucket: one script call per decision.
	RaceLua = "lua"
)

// RaceConfig sets up the race demo.
type RaceConfig struct {
	// URL is the Redis the worker processes connect to.
	URL string
	// Spawn returns the command that runs RaceWorker(ctx, args, stdout) in
	// a new OS process: `tollgate demo race-worker args...` for the
	// command, the test binary itself in tests.
	Spawn func(ctx context.Context, args []string) *exec.Cmd
	// Goroutines per process (default 32) and requests per goroutine
	// (default 1000).
	Goroutines, Requests int
}

// RaceRun is the outcome of one limiter's race. All times are Redis times.
type RaceRun struct {
	Mode string
	// Admitted counts every admitted request: the first call's raceFirst
	// plus what each process got.
	Admitted   int64
	PerProcess [2]int64
	// Bound is the most a correct limiter admits: the burst plus the tokens
	// refilled over Span. For the Lua limiter Span runs from the first to
	// the last admitted decision (the times ReserveN returned), and
	// Admitted equals Bound exactly; the naive one stores times out of
	// order, so its Span runs from the first decision until the processes
	// had exited — a bound it overruns anyway.
	Bound    int64
	Refilled int64
	Span     time.Duration
}

// Race starts two OS processes that hammer one token-bucket key
// (RaceLimit) with Goroutines × Requests calls each: first through a naive
// GET-compare-SET limiter, then through redisstore's script. A first call
// takes raceFirst of the burst's tokens, so the processes race for the rest
// and for what refills. The naive limiter admits more than any correct one
// could, because calls read the same tokens and each writes back its own
// decrement; the script admits exactly burst + refill, and Race checks that
// to the unit, from a look (a decision of cost 0) at the bucket the script
// left.
func Race(ctx context.Context, rdb redis.UniversalClient, w io.Writer, cfg RaceConfig) ([2]RaceRun, error) {
	var runs [2]RaceRun
	if cfg.URL == "" || cfg.Spawn == nil || cfg.Goroutines < 0 || cfg.Requests < 0 {
		return runs, errors.New("lab: race: the config needs the URL of the Redis and a Spawn function, and no negative counts")
	}
	if cfg.Goroutines == 0 {
		cfg.Goroutines = 32
	}
	if cfg.Requests == 0 {
		cfg.Requests = 1000
	}
	fmt.Fprintf(w, "# %s on one key; a first call takes %d tokens, then 2 processes × %d goroutines × %d requests race for the rest (Redis time)\n",
		describe(RaceLimit), raceFirst, cfg.Goroutines, cfg.Requests)
	for i, mode := range []string{RaceNaive, RaceLua} {
		r, err := race(ctx, rdb, cfg, mode)
		if err != nil {
			return runs, err
		}
		runs[i] = r
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range runs {
		name := "naive GET-compare-SET"
		if r.Mode == RaceLua {
			name = "lua (redisstore)"
		}
		verdict := "exactly the bound"
		switch {
		case r.Admitted > r.Bound:
			verdict = fmt.Sprintf("%d too many", r.Admitted-r.Bound)
		case r.Admitted < r.Bound:
			verdict = fmt.Sprintf("%d under the bound (the requests ran out first)", r.Bound-r.Admitted)
		}
		fmt.Fprintf(tw, "%s\tadmitted=%d (%d + %d + %d)\tbound=%d (burst %d + %d refilled in %v)\t%s\n",
			name, r.Admitted, raceFirst, r.PerProcess[0], r.PerProcess[1], r.Bound, RaceLimit.Burst, r.Refilled, r.Span, verdict)
	}
	return runs, tw.Flush()
}

func race(ctx context.Context, rdb redis.UniversalClient, cfg RaceConfig, mode string) (RaceRun, error) {
	run := RaceRun{Mode: mode}
	p, err := RaceLimit.Params()
	if err != nil {
		return run, fmt.Errorf("lab: race: %w", err)
	}
	id := freshKey("race")
	key := id
	if mode == RaceLua {
		key = redisstore.New(rdb).Key(id, RaceLimit)
	}
	ready, start := id+":ready", id+":go"
	defer rdb.Del(context.WithoutCancel(ctx), ready, start, key)

	// Start both processes and wait until both are connected, so neither
	// gets a head start whatever their start-up takes.
	ws, err := startWorkers(ctx, cfg, []string{mode, cfg.URL, id, strconv.Itoa(cfg.Goroutines), strconv.Itoa(cfg.Requests)})
	if err != nil {
		return run, err
	}
	first, waitErr := openRace(ctx, rdb, mode, id, key, ready, start, p)
	if waitErr != nil {
		ws.kill() // without the start signal the workers would wait in vain
	}
	ws.wait()
	if waitErr != nil {
		return run, fmt.Errorf("lab: race %s: %w (workers: %q, %q)", mode, waitErr, ws.logs[0].String(), ws.logs[1].String())
	}
	last, err := ws.collect(mode, first, &run)
	if err != nil {
		return run, err
	}
	run.Admitted = raceFirst + run.PerProcess[0] + run.PerProcess[1]
	if mode == RaceNaive {
		return naiveBound(ctx, rdb, run, first, p)
	}
	return luaBound(ctx, rdb, run, id, first, last, p)
}

// workers are the two processes of a race, with what they print.
type workers struct {
	cmds [2]*exec.Cmd
	outs [2]bytes.Buffer // stdout: the count
	logs [2]bytes.Buffer // stderr
	errs [2]error
	done sync.WaitGroup
}

// startWorkers starts the race's two processes with args, each waited for
// on a goroutine of its own.
func startWorkers(ctx context.Context, cfg RaceConfig, args []string) (*workers, error) {
	ws := &workers{}
	for i := range ws.cmds {
		cmd := cfg.Spawn(ctx, args)
		cmd.Stdout, cmd.Stderr = &ws.outs[i], &ws.logs[i]
		if err := cmd.Start(); err != nil {
			for _, c := range ws.cmds[:i] {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
			return nil, fmt.Errorf("lab: race: start a worker process: %w", err)
		}
		ws.cmds[i] = cmd
	}
	for i, cmd := range ws.cmds {
		ws.done.Go(func() { ws.errs[i] = cmd.Wait() })
	}
	return ws, nil
}

func (ws *workers) kill() {
	for _, c := range ws.cmds {
		_ = c.Process.Kill()
	}
}

func (ws *workers) wait() { ws.done.Wait() }

// collect reads what each worker admitted into run, and returns the Redis
// time (µs) of the last admitted decision, first if none came later.
func (ws *workers) collect(mode string, first int64, run *RaceRun) (last int64, err error) {
	last = first
	for i, err := range ws.errs {
		if err != nil {
			return 0, fmt.Errorf("lab: race %s: worker %d: %w: %s", mode, i, err, ws.logs[i].String())
		}
		var at int64
		if _, err := fmt.Sscan(ws.outs[i].String(), &run.PerProcess[i], &at); err != nil {
			return 0, fmt.Errorf("lab: race %s: worker %d printed %q", mode, i, ws.outs[i].String())
		}
		last = max(last, at)
	}
	return last, nil
}

// openRace waits until both workers are ready, makes the race's first call
// — which leaves the bucket below its capacity — and gives the start
// signal. It returns the Redis time (µs) at which the bucket was full.
func openRace(ctx context.Context, rdb redis.UniversalClient, mode, id, key, ready, start string, p tollgate.Params) (first int64, err error) {
	if err := waitFor(ctx, rdb, ready, 2); err != nil {
		return 0, err
	}
	if mode == RaceLua {
		res, at, err := redisstore.New(rdb).ReserveN(ctx, id, RaceLimit, raceFirst)
		if err != nil {
			return 0, err
		}
		if !res.Allowed {
			return 0, fmt.Errorf("the first call was denied: %+v", res)
		}
		first = at
	} else {
		now, err := redisTime(ctx, rdb)
		if err != nil {
			return 0, err
		}
		first = now.UnixMicro()
		if err := rdb.HSet(ctx, key, "tokens", (p.Burst-raceFirst)*p.Unit, "time", first).Err(); err != nil {
			return 0, err
		}
	}
	return first, rdb.Set(ctx, start, 1, time.Minute).Err()
}

// naiveBound is the naive limiter's bound, in Redis time. Its stored time
// can go backwards (a slow call writes an older time over a newer one), so
// the refill is counted up to now, after the processes exited: generous to
// it.
func naiveBound(ctx context.Context, rdb redis.UniversalClient, run RaceRun, first int64, p tollgate.Params) (RaceRun, error) {
	end, err := redisTime(ctx, rdb)
	if err != nil {
		return run, err
	}
	run.Span = time.Duration(end.UnixMicro()-first) * time.Microsecond
	run.Refilled = (end.UnixMicro() - first) * p.UnitRate / p.Unit
	run.Bound = p.Burst + run.Refilled
	return run, nil
}

// luaBound is the script's bound, in Redis time, checked to the unit. The
// bucket never reaches its capacity during the race (see raceFirst), so
// every unit refilled between the first and the last admitted decision was
// either spent or is still there: admitted × unit + left = burst × unit +
// refill.
func luaBound(ctx context.Context, rdb redis.UniversalClient, run RaceRun, id string, first, last int64, p tollgate.Params) (RaceRun, error) {
	tokens, now, err := lookBucket(ctx, redisstore.New(rdb), id, p)
	if err != nil {
		return run, err
	}
	left := tokens - (now-last)*p.UnitRate // the units the last decision left
	refilled := (last - first) * p.UnitRate
	run.Span = time.Duration(last-first) * time.Microsecond
	run.Refilled = refilled / p.Unit
	run.Bound = p.Burst + run.Refilled
	if got, want := run.Admitted*p.Unit+left, p.Burst*p.Unit+refilled; got != want {
		return run, fmt.Errorf("lab: race lua: admitted %d tokens (%d units) and %d units are left, but burst + refill is %d units: the script lost atomicity",
			run.Admitted, run.Admitted*p.Unit, left, want)
	}
	return run, nil
}

// lookBucket looks at RaceLimit's bucket for id (a decision of cost 0,
// which writes nothing) and returns the units it holds and the Redis time
// of the look (µs). At a unit rate of 1 a unit refills in a µs, so the
// time until the bucket is full, in µs, is exactly the units it lacks.
func lookBucket(ctx context.Context, s *redisstore.Store, id string, p tollgate.Params) (tokens, now int64, err error) {
	if p.UnitRate != 1 {
		return 0, 0, fmt.Errorf("lab: race: %s refills %d units a µs: a look tells the units only at 1", describe(RaceLimit), p.UnitRate)
	}
	res, now, err := s.ReserveN(ctx, id, RaceLimit, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("lab: race: look: %w", err)
	}
	if res.ResetAfter <= 0 {
		return 0, 0, errors.New("lab: race: the bucket was full again when the race was over: refill was lost to the cap, and the count cannot be checked")
	}
	return p.Burst*p.Unit - res.ResetAfter.Microseconds(), now, nil
}

// waitFor polls key until it holds at least n, or ctx ends, or 30 s pass.
func waitFor(ctx context.Context, rdb redis.UniversalClient, key string, n int64) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := rdb.Get(ctx, key).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if v >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is %d after 30 s, want %d", key, v, n)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return err
		}
	}
}

// RaceWorker is one of Race's processes. Its arguments are the mode
// (RaceNaive or RaceLua), the Redis URL, the demo's key, goroutines and
// requests per goroutine. It says it is ready, waits for the start signal,
// hammers the key, and prints how many requests were admitted and the Redis
// time (µs) of the last admitted decision (0 for the naive limiter).
func RaceWorker(ctx context.Context, args []string, w io.Writer) error {
	if len(args) != 5 || (args[0] != RaceNaive && args[0] != RaceLua) {
		return fmt.Errorf("lab: race worker: want arguments: naive|lua URL KEY GOROUTINES REQUESTS, got %q", args)
	}
	mode, url, id := args[0], args[1], args[2]
	goroutines, err1 := strconv.Atoi(args[3])
	requests, err2 := strconv.Atoi(args[4])
	if err := errors.Join(err1, err2); err != nil || goroutines < 1 || requests < 1 {
		return fmt.Errorf("lab: race worker: bad counts %q: %v", args[3:], err)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("lab: race worker: %w", err)
	}
	opt.PoolSize = goroutines
	opt.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	p, err := RaceLimit.Params()
	if err != nil {
		return fmt.Errorf("lab: race worker: %w", err)
	}
	var last atomic.Int64 // the Lua limiter's last admitted decision (µs)
	allow := func(ctx context.Context) (bool, error) { return naiveBucket(ctx, rdb, id, p) }
	if mode == RaceLua {
		allow = luaAllow(redisstore.New(rdb), id, &last)
	}
	if err := getReady(ctx, rdb, id, goroutines); err != nil {
		return fmt.Errorf("lab: race worker: %w", err)
	}
	admitted, err := spend(ctx, allow, goroutines, requests)
	if err != nil {
		return fmt.Errorf("lab: race worker: %w", err)
	}
	_, err = fmt.Fprintln(w, admitted, last.Load())
	return err
}

// luaAllow decides one request of the race through the store's script and
// keeps in last the Redis time of the latest it admitted.
func luaAllow(s *redisstore.Store, id string, last *atomic.Int64) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		res, at, err := s.ReserveN(ctx, id, RaceLimit, 1)
		if err != nil || !res.Allowed {
			return false, err
		}
		for {
			v := last.Load()
			if at <= v || last.CompareAndSwap(v, at) {
				return true, nil
			}
		}
	}
}

// getReady opens the pool's connections, says the worker is ready and
// waits for the start signal, so that the start is not spent dialling.
func getReady(ctx context.Context, rdb *redis.Client, id string, goroutines int) error {
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() { _ = rdb.Ping(ctx).Err() })
	}
	wg.Wait()
	if err := rdb.Incr(ctx, id+":ready").Err(); err != nil {
		return err
	}
	if err := waitFor(ctx, rdb, id+":go", 1); err != nil {
		return fmt.Errorf("wait for the start: %w", err)
	}
	return nil
}

// spend makes requests calls of allow from each of goroutines goroutines
// and returns how many it admitted, or the first error.
func spend(ctx context.Context, allow func(context.Context) (bool, error), goroutines, requests int) (int64, error) {
	var (
		wg       sync.WaitGroup
		admitted atomic.Int64
		failed   atomic.Pointer[error]
	)
	for range goroutines {
		wg.Go(func() {
			for range requests {
				ok, err := allow(ctx)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, *err
	}
	return admitted.Load(), nil
}

// naiveBucket is the limiter that breaks under concurrency: the same token bucket,
// in the same integer units, decided in Go between a read (TIME and HMGET,
// pipelined) and a write (HSET) of a hash of its own. Nothing holds the key
// in between, so calls that read the same tokens each spend one and write
// back their own count.
func naiveBucket(ctx context.Context, rdb *redis.Client, key string, p tollgate.Params) (bool, error) {
	var (
		now *redis.TimeCmd
		st  *redis.SliceCmd
	)
	if _, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		now = pipe.Time(ctx)
		st = pipe.HMGet(ctx, key, "tokens", "time")
		return nil
	}); err != nil {
		return false, err
	}
	t := now.Val().UnixMicro()
	capacity := p.Burst * p.Unit
	tokens, ts := capacity, t
	if v := st.Val(); len(v) == 2 && v[0] != nil {
		s0, ok0 := v[0].(string)
		s1, ok1 := v[1].(string)
		var err0, err1 error
		tokens, err0 = strconv.ParseInt(s0, 10, 64)
		ts, err1 = strconv.ParseInt(s1, 10, 64)
		if !ok0 || !ok1 || err0 != nil || err1 != nil {
			return false, fmt.Errorf("%s holds %v, not a bucket", key, v)
		}
	}
	if t > ts {
		tokens = min(capacity, tokens+(t-ts)*p.UnitRate)
		ts = t
	}
	if tokens < p.Unit {
		return false, nil
	}
	tokens -= p.Unit
	return true, rdb.HSet(ctx, key, "tokens", tokens, "time", ts).Err()
}
