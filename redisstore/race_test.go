package redisstore_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/redisstore"
)

// The race test re-executes this test binary as two child processes that
// hammer one key at once. A child learns what to do from raceChildEnv.
const raceChildEnv = "TOLLGATE_RACE_CHILD"

const (
	raceGoroutines = 32
	raceRequests   = 1000 // per goroutine
)

// raceChild runs in a child process: "addr key algorithm rate period
// burst". Once its sibling is ready too (waitGo) it prints how many
// requests were admitted and when its first and last decisions were made.
func raceChild() {
	f := strings.Fields(os.Getenv(raceChildEnv))
	alg, _ := tollgate.ParseAlgorithm(f[2])
	rate, _ := strconv.Atoi(f[3])
	period, _ := time.ParseDuration(f[4])
	burst, _ := strconv.Atoi(f[5])
	limit := tollgate.Limit{Algorithm: alg, Rate: rate, Period: period, Burst: burst}

	rdb := redis.NewClient(&redis.Options{Addr: f[0], PoolSize: raceGoroutines})
	defer rdb.Close()
	s := redisstore.New(rdb)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	waitGo()

	var admitted, failed atomic.Int64
	first := time.Now()
	var wg sync.WaitGroup
	for range raceGoroutines {
		wg.Go(func() {
			for range raceRequests {
				res, err := s.AllowN(ctx, f[1], limit, 1)
				switch {
				case err != nil:
					failed.Add(1)
				case res.Allowed:
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Println(admitted.Load(), failed.Load(), first.UnixNano(), time.Now().UnixNano())
}

type childReport struct {
	admitted, failed int64
	first, last      int64 // unix ns
}

// runRace starts two children on key under limit and returns their reports.
func runRace(t *testing.T, key string, limit tollgate.Limit) [2]childReport {
	t.Helper()
	spec := fmt.Sprintf("%s=%s %s %s %d %s %d", raceChildEnv, server.Addr(), key, limit.Algorithm, limit.Rate, limit.Period, limit.Burst)
	var (
		reports [2]childReport
		errs    [2]error
		wg      sync.WaitGroup
	)
	for i, c := range startTogether(t, spec, spec) {
		wg.Go(func() {
			out, _ := io.ReadAll(c.out)
			if errs[i] = c.wait(); errs[i] != nil {
				errs[i] = fmt.Errorf("child %d: %w: %s", i, errs[i], out)
				return
			}
			r := &reports[i]
			if _, err := fmt.Sscan(string(out), &r.admitted, &r.failed, &r.first, &r.last); err != nil {
				errs[i] = fmt.Errorf("child %d printed %q: %w", i, out, err)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		if reports[i].failed != 0 {
			t.Fatalf("child %d: %d decisions failed", i, reports[i].failed)
		}
		if reports[i].admitted == 0 {
			t.Errorf("child %d admitted nothing: did both processes take part?", i)
		}
	}
	if reports[0].last < reports[1].first || reports[1].last < reports[0].first {
		t.Errorf("the two processes did not run at the same time: %+v", reports)
	}
	return reports
}

// TestRaceTwoProcesses: two OS processes, 32 goroutines each, 1000 requests
// per goroutine, on one token-bucket key. The total admitted must equal the
// burst plus exactly the tokens refilled between the first and the last
// decision, in Redis time; a non-atomic limiter admits more.
func TestRaceTwoProcesses(t *testing.T) {
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)

	t.Run("token bucket", func(t *testing.T) {
		// 20 per second, burst 1000. The first decision spends 990, leaving
		// 10 for the children to race for, plus the refill. Spending most
		// of the burst first keeps the bucket from filling up to its
		// capacity while the children start (that would take 49.5 s, on
		// the busiest machine), so no refill is lost to the cap and the
		// count below is exact.
		limit := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 20, Period: time.Second, Burst: 1000}
		k := key(t)
		if res, err := s.AllowN(ctx, k, limit, 990); err != nil || !res.Allowed {
			t.Fatalf("first decision: %+v, %v", res, err)
		}
		first := bucketState(t, rdb, s.Key(k, limit))

		reports := runRace(t, k, limit)
		last := bucketState(t, rdb, s.Key(k, limit))

		p, _ := limit.Params()
		admitted := 990 + reports[0].admitted + reports[1].admitted
		// Units: refill adds UnitRate per µs of Redis time; a token is Unit.
		refilled := (last.ts - first.ts) * p.UnitRate
		if got, want := admitted*p.Unit+last.tokens, p.Burst*p.Unit+refilled; got != want {
			t.Errorf("admitted %d (%d units, %d left); burst + refill over %v of Redis time = %d units",
				admitted, admitted*p.Unit, last.tokens, time.Duration(last.ts-first.ts)*time.Microsecond, want)
		}
		if last.tokens >= p.Unit {
			t.Errorf("%d units left after the race: a whole token went unspent under 64,000 requests", last.tokens)
		}
		bound := p.Burst + refilled/p.Unit
		t.Logf("admitted %d = burst %d + %d refilled in %v (children: %d, %d)",
			admitted, p.Burst, refilled/p.Unit, time.Duration(last.ts-first.ts)*time.Microsecond, reports[0].admitted, reports[1].admitted)
		if admitted != bound {
			t.Errorf("admitted %d, bound %d", admitted, bound)
		}
	})

	t.Run("sliding window log", func(t *testing.T) {
		// 100 per minute: the whole run fits in one window, so any window
		// holds every admitted request: exactly the limit, no more.
		limit := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 100, Period: time.Minute}
		k := key(t)
		reports := runRace(t, k, limit)
		if got := reports[0].admitted + reports[1].admitted; got != 100 {
			t.Errorf("admitted %d, want exactly 100", got)
		}
		if n, _ := rdb.ZCard(ctx, s.Key(k, limit)).Result(); n != 100 {
			t.Errorf("log holds %d entries, want 100 (one per admitted request)", n)
		}
	})
}

type bucket struct{ tokens, ts int64 }

func bucketState(t *testing.T, rdb *redis.Client, k string) bucket {
	t.Helper()
	v, err := bucketFields(context.Background(), rdb, k)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err1 := strconv.ParseInt(v["t"], 10, 64)
	ts, err2 := strconv.ParseInt(v["ts"], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("bucket %s holds %v", k, v)
	}
	return bucket{tokens, ts}
}
