package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/redisstore"
)

// TestSettleTwoProcesses re-executes this test binary as two child
// processes that reserve, settle and refund at random on the same keys at
// once, on Redis's clock. A child learns what to do from settleChildEnv.
const settleChildEnv = "TOLLGATE_SETTLE_CHILD"

const (
	settleGoroutines = 4
	settleOps        = 150 // per goroutine
	settleKeys       = 2   // shared keys, each under every limit
)

// settleLimits are short enough that refill, window ends and log entries
// leaving the window happen while the children run.
var settleLimits = []tollgate.Limit{
	{Algorithm: tollgate.TokenBucket, Rate: 200, Period: time.Second, Burst: 10},
	{Algorithm: tollgate.GCRA, Rate: 200, Period: time.Second, Burst: 10},
	{Algorithm: tollgate.LeakyBucket, Rate: 200, Period: time.Second, Burst: 10},
	{Algorithm: tollgate.LeakyBucket, Rate: 400, Period: 2 * time.Second, Burst: 5, MaxDelay: 50 * time.Millisecond},
	{Algorithm: tollgate.FixedWindow, Rate: 30, Period: 200 * time.Millisecond},
	{Algorithm: tollgate.SlidingWindowCounter, Rate: 30, Period: 200 * time.Millisecond},
	{Algorithm: tollgate.SlidingWindowLog, Rate: 30, Period: 200 * time.Millisecond},
}

// settleOp is one call a child made, as it logs it: op is "reserve" (n the
// cost) or "settle" (n reserved, actual, at the reservation's time); t is
// the Redis server's time of the call, from its reply.
type settleOp struct {
	proc, key, limit int
	op               string
	n, actual        int
	at, t            int64
	res              tollgate.Result
}

func (o settleOp) String() string {
	return fmt.Sprintf("%d %d %d %s %d %d %d %d %v %d %d %d %d", o.proc, o.key, o.limit, o.op, o.n, o.actual, o.at, o.t,
		o.res.Allowed, o.res.Remaining, o.res.RetryAfter, o.res.ResetAfter, o.res.Delay)
}

func parseSettleOp(line string) (settleOp, error) {
	var (
		o                   settleOp
		retry, reset, delay int64
	)
	_, err := fmt.Sscan(line, &o.proc, &o.key, &o.limit, &o.op, &o.n, &o.actual, &o.at, &o.t,
		&o.res.Allowed, &o.res.Remaining, &retry, &reset, &delay)
	o.res.RetryAfter, o.res.ResetAfter, o.res.Delay = time.Duration(retry), time.Duration(reset), time.Duration(delay)
	return o, err
}

// settleChild runs in a child process: "addr prefix proc seed". Once its
// sibling is ready too (waitGo), each goroutine reserves on a random key under a random
// limit and settles its own reservations (each once) with a random actual
// cost, a refund (0) as often as not, and prints every call.
func settleChild() {
	f := strings.Fields(os.Getenv(settleChildEnv))
	proc, _ := strconv.Atoi(f[2])
	seed, _ := strconv.ParseUint(f[3], 10, 64)
	rdb := redis.NewClient(&redis.Options{Addr: f[0], PoolSize: settleGoroutines})
	defer rdb.Close()
	// Unpipelined, every call reads the server's clock on its own, and the
	// times order the calls on a key; a batch's decisions share one reading.
	s := redisstore.New(rdb, redisstore.WithPipeline(0, 0))
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	waitGo()

	var (
		mu   sync.Mutex
		out  = bufio.NewWriter(os.Stdout)
		wg   sync.WaitGroup
		fail = false
	)
	for g := range settleGoroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			type reservation struct {
				key, limit, n int
				at            int64
			}
			var open []reservation
			for range settleOps {
				o := settleOp{proc: proc}
				var err error
				if len(open) > 0 && rng.IntN(3) > 0 {
					i := rng.IntN(len(open))
					r := open[i]
					open = slices.Delete(open, i, i+1)
					o.key, o.limit, o.op, o.n, o.at = r.key, r.limit, "settle", r.n, r.at
					if rng.IntN(2) == 0 {
						o.actual = rng.IntN(3 * r.n)
					}
					o.res, o.t, err = redisstore.SettleAt(ctx, s, settleKey(f[1], o.key), settleLimits[o.limit], o.at, o.n, o.actual)
				} else {
					o.key, o.limit, o.op = rng.IntN(settleKeys), rng.IntN(len(settleLimits)), "reserve"
					o.n = 1 + rng.IntN(3)
					o.res, o.at, err = s.ReserveN(ctx, settleKey(f[1], o.key), settleLimits[o.limit], o.n)
					o.t = o.at
					if err == nil && o.res.Allowed {
						open = append(open, reservation{o.key, o.limit, o.n, o.at})
					}
				}
				mu.Lock()
				if err != nil {
					fmt.Fprintln(out, "error", err)
					fail = true
				} else {
					fmt.Fprintln(out, o)
				}
				mu.Unlock()
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
				}
			}
		})
	}
	wg.Wait()
	out.Flush()
	if fail {
		os.Exit(1)
	}
}

func settleKey(prefix string, i int) string { return prefix + ":" + strconv.Itoa(i) }

// TestSettleTwoProcesses: two OS processes, 4 goroutines each, reserve,
// settle and refund at random on the same two keys under seven limits at
// once, on the Redis server's clock. Every call's reply carries the
// server's time of the call (ReserveN returns it, and so does the settle
// reply, read here through SettleAt); Redis runs one script at a time and
// each reads TIME once, so those times order the calls on a key as Redis
// applied them (the test checks that no two calls on a key share a µs,
// which would leave the order unknown). Replayed one by one in that order
// on the model, its clock set to each call's time, every call must get
// the Result the children got — whatever the two processes interleaved,
// each call saw exactly the state the calls before it left — and every
// key must end as the replay's.
func TestSettleTwoProcesses(t *testing.T) {
	t.Parallel()
	prefix := key(t)
	var (
		logs [2][]settleOp
		errs [2]error
		wg   sync.WaitGroup
	)
	kids := startTogether(t,
		fmt.Sprintf("%s=%s %s %d %d", settleChildEnv, server.Addr(), prefix, 0, rand.Uint64()),
		fmt.Sprintf("%s=%s %s %d %d", settleChildEnv, server.Addr(), prefix, 1, rand.Uint64()))
	for i, c := range kids {
		wg.Go(func() {
			out, _ := io.ReadAll(c.out)
			if errs[i] = c.wait(); errs[i] != nil {
				errs[i] = fmt.Errorf("child %d: %w: %s", i, errs[i], out)
				return
			}
			for line := range strings.Lines(string(out)) {
				o, err := parseSettleOp(line)
				if err != nil {
					errs[i] = fmt.Errorf("child %d printed %q: %w", i, line, err)
					return
				}
				logs[i] = append(logs[i], o)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ops := append(logs[0], logs[1]...)
	if got, want := len(ops), 2*settleGoroutines*settleOps; got != want {
		t.Fatalf("the children logged %d calls, want %d", got, want)
	}
	// Sorted by the server's time; calls on one key must not share one.
	slices.SortStableFunc(ops, func(a, b settleOp) int { return int(a.t - b.t) })
	last := map[[2]int]int64{}
	settled, denied := [2]int{}, 0
	for _, o := range ops {
		k := [2]int{o.key, o.limit}
		if t0, ok := last[k]; ok && t0 == o.t {
			t.Fatalf("two calls on one key at the same µs of Redis time (%d): their order is unknown", o.t)
		}
		last[k] = o.t
		if o.op == "settle" {
			settled[o.proc]++
		} else if !o.res.Allowed {
			denied++
		}
	}
	var first, final [2]int64
	for i, log := range logs {
		first[i], final[i] = log[0].t, log[0].t
		for _, o := range log {
			first[i], final[i] = min(first[i], o.t), max(final[i], o.t)
		}
	}
	if first[0] > final[1] || first[1] > final[0] {
		t.Errorf("the two processes did not run at the same time: %v to %v, %v to %v", first[0], final[0], first[1], final[1])
	}
	if settled[0] == 0 || settled[1] == 0 {
		t.Fatalf("settles by process: %v, want some from each", settled)
	}

	// The children's keys, as they are at the server's instant end: one
	// MULTI reads TIME and lengthens every key's TTL (a key that expired
	// before was full by then, or out of every window).
	shared := redisstore.New(server.Client(t))
	ctx := context.Background()
	var tm *redis.TimeCmd
	if _, err := server.Client(t).TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		for k := range settleKeys {
			for _, limit := range settleLimits {
				p.PExpire(ctx, shared.Key(settleKey(prefix, k), limit), time.Hour)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	end := tm.Val().UnixMicro()

	// The model (internal/test/model, exact and independent of both stores)
	// replays every call, one by one, on its own clock set to the call's
	// time.
	clock := conformance.NewClock()
	replay := conformance.NewModelStore(clock.Now)
	for i, o := range ops {
		clock.Set(time.UnixMicro(o.t).Sub(conformance.T0))
		limit := settleLimits[o.limit]
		var (
			got tollgate.Result
			err error
		)
		if o.op == "reserve" {
			got, _, err = replay.ReserveN(ctx, settleKey(prefix, o.key), limit, o.n)
		} else {
			got, err = replay.SettleN(ctx, settleKey(prefix, o.key), limit, o.at, o.n, o.actual)
		}
		if err != nil {
			t.Fatal(err)
		}
		o.res.Limit = limit
		if got != o.res {
			t.Fatalf("call %d of %d, by process %d, %s %d→%d under %v (reserved at %d) at %d:\nchild  %+v\nreplay %+v", i, len(ops), o.proc, o.op, o.n, o.actual, limit, o.at, o.t, o.res, got)
		}
	}
	// Afterwards every key looks the same, the children's and the
	// replay's, at the instant end.
	clock.Set(time.UnixMicro(end).Sub(conformance.T0))
	at := redisstore.New(server.Client(t), redisstore.WithClock(clock.Now))
	for k := range settleKeys {
		for l, limit := range settleLimits {
			got, err := at.AllowN(ctx, settleKey(prefix, k), limit, 0)
			if err != nil {
				t.Fatal(err)
			}
			want, err := replay.AllowN(ctx, settleKey(prefix, k), limit, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("key %d under limit %d (%v) at the end: %+v, replayed %+v", k, l, limit, got, want)
			}
		}
	}
	t.Logf("%d calls, %d of them settles, %d denied reservations, replayed in Redis's order", len(ops), settled[0]+settled[1], denied)
}
