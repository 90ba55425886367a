package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/redisstore"
)

const (
	// goroutines make decisions at once in every load.
	goroutines = 32
	// deadline bounds every decision (tollgate.WithTimeout), as a service
	// on a request path would.
	deadline = 100 * time.Millisecond
	// margin is how much longer than its deadline a decision may take
	// before the test calls it late. go-redis enforces the deadline with
	// socket deadlines and context checks; what comes on top is scheduling:
	// 32 goroutines plus the race detector on 2 cores shared with other
	// test binaries, and GC. 200 ms (twice the deadline) absorbs that, and
	// is still an order of magnitude below what an ignored deadline costs:
	// go-redis's ReadTimeout (5 s) on a hung server, its dial retries on
	// a dead one, or forever.
	margin = 200 * time.Millisecond
)

// A profile is a set of go-redis client options the standalone tests run
// under. Both bound every call by its context (ContextTimeoutEnabled);
// without that go-redis ignores context deadlines and waits ReadTimeout.
type profile struct {
	name string
	opts func(addr string) *redis.Options
}

var profiles = []profile{
	// go-redis's defaults: on a refused connection the pool re-dials 5
	// times 100 ms apart and the command is retried 3 times, so a decision
	// against a dead Redis waits out its whole deadline.
	{"defaults", func(addr string) *redis.Options {
		return &redis.Options{Addr: addr, ContextTimeoutEnabled: true}
	}},
	// Fail fast: one dial, no retries. A decision against a dead Redis
	// fails as soon as the connection is refused, and the caller's failure
	// policy (fail open or closed) answers at once.
	{"fail fast", func(addr string) *redis.Options {
		return &redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: -1}
	}},
}

func newClient(t *testing.T, opts *redis.Options) *redis.Client {
	t.Helper()
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pipelined is the pipelining option the tests run half their goroutines
// with (redisstore.WithPipeline): a batch goes after 50 µs or 16 decisions.
var pipelined = redisstore.WithPipeline(50*time.Microsecond, 16)

// limiters returns two Limiters on client with deadline d on every call:
// one whose store makes a round trip per decision, and one whose store
// pipelines concurrent decisions. Loads run half their goroutines on each,
// so every fault meets both paths.
func limiters(client redis.UniversalClient, d time.Duration) []*tollgate.Limiter {
	return []*tollgate.Limiter{
		tollgate.New(redisstore.New(client), tollgate.WithTimeout(d)),
		tollgate.New(redisstore.New(client, pipelined), tollgate.WithTimeout(d)),
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func key(t *testing.T) string { return fmt.Sprintf("%s:%d", t.Name(), rand.Int64()) }

// spread cycles every goroutine through all six algorithms on 500 keys
// under a generous limit, so that most decisions are allowed and each
// writes state.
func spread(prefix string) func(g, i int) call {
	algs := tollgate.Algorithms()
	return func(g, i int) call {
		return call{
			key:   fmt.Sprintf("%s:%d", prefix, (g*1009+i)%500),
			limit: tollgate.Limit{Algorithm: algs[i%len(algs)], Rate: 1000, Period: time.Second, Burst: 1000},
			n:     1,
		}
	}
}

// warmUp waits until every goroutine of l has made a decision and then for
// a window of 200 ms in which no decision failed, marks l (see load.mark)
// and returns its summary. Decisions may fail before that — the first ones dial, and load
// the scripts, on two busy cores with the race detector — but a healthy
// Redis must give a clean window within a few tries.
func warmUp(t *testing.T, ctx context.Context, l *load) summary {
	t.Helper()
	if _, err := l.waitAllOK(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	prev := l.summary()
	for range 10 {
		time.Sleep(200 * time.Millisecond)
		s := l.summary()
		if s.errs == prev.errs {
			l.mark()
			return l.summary()
		}
		prev = s
	}
	t.Fatalf("decisions kept failing against a healthy Redis: %v", prev)
	return prev
}

// TestKilledAndRestarted crashes Redis (SIGKILL) under load, keeps it down
// for a second and starts it again, empty, on the same port. It is not
// parallel: it measures how long calls take.
func TestKilledAndRestarted(t *testing.T) {
	const outage = time.Second
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			s := redistest.NewServer(t)
			lims := limiters(newClient(t, p.opts(s.Addr())), deadline)
			ctx := ctxTimeout(t, 30*time.Second)
			l := startLoad(t, lims, goroutines, spread(key(t)))
			healthy := warmUp(t, ctx, l)

			killed := time.Now()
			if err := s.Stop(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(outage)
			down := l.summary()
			restarting := time.Now()
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			started := time.Now()
			up := l.summary()
			if _, err := l.waitAllOK(ctx, restarting); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			l.stop()
			end := l.summary()
			end.check(t)

			if got := down.errs - healthy.errs; got == 0 {
				t.Errorf("no decision failed in %v without Redis", outage)
			}
			if end.recovered.IsZero() {
				t.Error("some goroutine never succeeded again after Redis came back")
			}
			t.Logf("killed for %v: %d decisions failed while down; first failure %v after the kill; "+
				"Start took %v; every goroutine succeeded again %v after Start began; %d decisions failed after Start returned\n%v",
				outage, down.errs-healthy.errs, end.firstErr.Sub(killed).Round(time.Microsecond),
				started.Sub(restarting).Round(time.Millisecond),
				end.recovered.Sub(restarting).Round(time.Millisecond), end.errs-up.errs, end)
		})
	}
}

// TestPaused stops Redis with SIGSTOP under load for two seconds: its
// connections stay open, the kernel still accepts new ones, and nothing is
// answered — the hung server, the worst case for deadlines. Every decision
// must return within its deadline plus margin, and decisions must resume
// after SIGCONT. It is not parallel: it measures how long calls take and
// counts the process's goroutines.
func TestPaused(t *testing.T) {
	const pause = 2 * time.Second
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			s := redistest.NewServer(t)
			client := newClient(t, p.opts(s.Addr()))
			ctx := ctxTimeout(t, 30*time.Second)
			l := startLoad(t, limiters(client, deadline), goroutines, spread(key(t)))
			healthy := warmUp(t, ctx, l)
			before := measure()

			paused := time.Now()
			if err := s.Pause(); err != nil {
				t.Fatal(err)
			}
			peak := watch(pause, nil)
			resuming := time.Now()
			if err := s.Resume(); err != nil {
				t.Fatal(err)
			}
			down := l.summary()
			if _, err := l.waitAllOK(ctx, resuming); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			after := measure()
			l.stop()
			end := l.summary()
			end.check(t)

			if got := down.errs - healthy.errs; got == 0 {
				t.Errorf("no decision failed in %v of a paused Redis", pause)
			}
			checkGoroutines(t, client, before, peak)
			t.Logf("paused for %v: %d decisions failed, first %v after SIGSTOP, slowest call %v (deadline %v); "+
				"every goroutine succeeded again %v after SIGCONT; goroutines %d before, at most %d during; "+
				"heap %s before, %s after\n%v",
				pause, down.errs-healthy.errs, end.firstErr.Sub(paused).Round(time.Millisecond), end.maxDur.Round(time.Millisecond), deadline,
				end.recovered.Sub(resuming).Round(time.Millisecond), before.goroutines, peak.goroutines,
				mib(before.heap), mib(after.heap), end)
		})
	}
}

// TestLongOutageMemory keeps Redis down under load with the fail-fast
// client until at least 25,000 decisions have failed, and checks that the
// live heap after the outage is within 2 MiB of what it was before: a
// failed decision must not leave anything behind (a pooled connection, a
// goroutine, a buffer). A leak of 84 bytes per failed decision would exceed
// the bound. It is not parallel: the heap and the goroutine count are the
// process's.
func TestLongOutageMemory(t *testing.T) {
	const (
		failures  = 25_000
		growth    = 2 << 20
		maxOutage = 20 * time.Second
	)
	s := redistest.NewServer(t)
	client := newClient(t, profiles[1].opts(s.Addr()))
	ctx := ctxTimeout(t, 30*time.Second)
	l := startLoad(t, limiters(client, deadline), goroutines, spread(key(t)))
	healthy := warmUp(t, ctx, l)
	before := measure()

	killed := time.Now()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	peak := watch(maxOutage, func() bool { return l.summary().errs-healthy.errs >= failures })
	outage := time.Since(killed)
	down := l.summary()
	restarting := time.Now()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.waitAllOK(ctx, restarting); err != nil {
		t.Fatal(err)
	}
	after := measure()
	l.stop()
	l.summary().check(t)

	failed := down.errs - healthy.errs
	t.Logf("%d decisions failed in %v; live heap %s before, %s after (%+d bytes, %.2f per failure); goroutines %d before, at most %d during, %d after",
		failed, outage.Round(time.Millisecond), mib(before.heap), mib(after.heap), int64(after.heap)-int64(before.heap),
		float64(int64(after.heap)-int64(before.heap))/float64(failed), before.goroutines, peak.goroutines, after.goroutines)
	if failed < failures {
		t.Errorf("only %d decisions failed in %v; the heap bound needs %d", failed, outage, failures)
	}
	if after.heap > before.heap+growth {
		t.Errorf("live heap grew from %s to %s over the outage, more than %s", mib(before.heap), mib(after.heap), mib(growth))
	}
	checkGoroutines(t, client, before, peak)
}

// checkGoroutines fails t if the process had more goroutines during a fault
// than before it plus what may legitimately come and go: go-redis's dialer
// per pool slot and a connection handed over per slot, a pipelined batch
// in flight per load goroutine at most, and a few timers and probes.
// Anything beyond that piles up per failed call.
func checkGoroutines(t *testing.T, client *redis.Client, before, peak usage) {
	t.Helper()
	if limit := before.goroutines + 2*client.Options().PoolSize + goroutines + 10; peak.goroutines > limit {
		t.Errorf("%d goroutines during the fault, %d before: more than %d", peak.goroutines, before.goroutines, limit)
	}
}

// usage is the process's live heap (after a GC) and goroutine count.
type usage struct {
	heap       uint64
	goroutines int
}

func measure() usage {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return usage{heap: m.HeapAlloc, goroutines: runtime.NumGoroutine()}
}

// watch samples the goroutine count until done reports true (nil: never) or
// d has passed, and returns the peak.
func watch(d time.Duration, done func() bool) usage {
	var peak usage
	for end := time.Now().Add(d); time.Now().Before(end) && (done == nil || !done()); time.Sleep(10 * time.Millisecond) {
		peak.goroutines = max(peak.goroutines, runtime.NumGoroutine())
	}
	return peak
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// TestRestartedEmpty spends every algorithm's limit on a key, restarts
// Redis (which keeps nothing: no RDB, no AOF) and pins down what a client
// sees next: no error — go-redis replaces its dead connections, and the
// EVALSHA the empty script cache refuses with NOSCRIPT is retried as EVAL —
// and a full allowance, as if the key had never been seen. It is not
// parallel with the other standalone tests' timings in mind.
func TestRestartedEmpty(t *testing.T) {
	for _, p := range profiles {
		for i, store := range []string{"plain", "pipelined"} {
			t.Run(p.name+"/"+store, func(t *testing.T) { restartedEmpty(t, p, i) })
		}
	}
}

// restartedEmpty is TestRestartedEmpty with profile p and limiters(...)[i].
func restartedEmpty(t *testing.T, p profile, i int) {
	s := redistest.NewServer(t)
	// Not the fault tests' 100 ms: this test checks every decision, and a
	// loaded machine can stall longer than that.
	lim := limiters(newClient(t, p.opts(s.Addr())), 5*time.Second)[i]
	ctx := ctxTimeout(t, 30*time.Second)
	k := key(t)
	limits := map[tollgate.Algorithm]tollgate.Limit{}
	denied := map[tollgate.Algorithm]tollgate.Result{}
	for _, a := range tollgate.Algorithms() {
		// A day, so that a fixed window does not roll over during the
		// test (unless it runs across midnight UTC).
		limits[a] = tollgate.Limit{Algorithm: a, Rate: 3, Period: 24 * time.Hour, Burst: 3}
		for i := range 3 {
			if res, err := lim.Allow(ctx, k, limits[a]); err != nil || !res.Allowed {
				t.Fatalf("%s: call %d = %+v, %v; want allowed", a, i, res, err)
			}
		}
		res, err := lim.Allow(ctx, k, limits[a])
		if err != nil || res.Allowed || res.RetryAfter <= 0 {
			t.Fatalf("%s: fourth call = %+v, %v; want denied", a, res, err)
		}
		denied[a] = res
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	for _, a := range tollgate.Algorithms() {
		res, err := lim.Allow(ctx, k, limits[a])
		if err != nil {
			t.Fatalf("%s: first decision after the restart: %v", a, err)
		}
		want := tollgate.Result{Allowed: true, Limit: limits[a], Remaining: 2}
		// ResetAfter is how long one spent unit takes to come back,
		// which depends on the algorithm; the rest is exact.
		got := res
		got.ResetAfter = 0
		if got != want {
			t.Errorf("%s: first decision after the restart = %+v, want %+v (a full allowance)", a, res, want)
		}
		t.Logf("%-22s before the restart: denied, retry after %v; after: allowed, %d remaining",
			a, denied[a].RetryAfter.Round(time.Second), res.Remaining)
	}
	// The restarted server had none of the scripts: each was refused once
	// (NOSCRIPT) and then sent in full (EVAL).
	stats, err := s.Client(t).Info(ctx, "errorstats", "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := infoCount(stats, "errorstat_NOSCRIPT"), len(tollgate.Algorithms()); got != want {
		t.Errorf("NOSCRIPT errors after the restart = %d, want %d (one per script)", got, want)
	}
	if got, want := infoCount(stats, "cmdstat_eval"), len(tollgate.Algorithms()); got != want {
		t.Errorf("EVAL calls after the restart = %d, want %d (one per script)", got, want)
	}
}

// infoCount returns the count= field of an INFO line such as
// "errorstat_NOSCRIPT:count=6" or "cmdstat_eval:calls=6,...", or 0.
func infoCount(info, name string) int {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), name+":")
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			if k == "count" || k == "calls" {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
	}
	return 0
}
