package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/redisstore"
)

// TestModelAll checks AllowAll against the reference model on a standalone
// server and a Cluster, by script and by the function library: random sets
// of up to four limits of any algorithms on one key, with limit changes,
// clock steps back, and expired keys deleted or left at random, beside
// AllowN on the same keys (see conformance.ModelAll). Each call is also
// checked for what it leaves in Redis: a limit asked for a look or denied
// keeps its value byte for byte, and every key's TTL is the model's.
func TestModelAll(t *testing.T) {
	s := modelSeedFor(t)
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
	}{{"standalone", standalone}, {"cluster", clustered}} {
		t.Run(topo.name+"/script", func(t *testing.T) {
			t.Parallel()
			conformance.ModelAll(t, modelTarget(topo.client), rand.NewPCG(s, 0xa11), *modelSteps)
		})
		t.Run(topo.name+"/function", func(t *testing.T) {
			t.Parallel()
			conformance.ModelAll(t, loaded(topo.client), rand.NewPCG(s, 0xa12), *modelSteps)
		})
	}
}

// TestAllowAllSendsNothingInvalid: a set the store refuses reaches no
// server.
func TestAllowAllSendsNothingInvalid(t *testing.T) {
	t.Parallel()
	hook := &callHook{n: map[string]int{}}
	rdb := server.Client(t)
	rdb.AddHook(hook)
	st := redisstore.New(rdb, redisstore.WithPrefix(testkit.KeyPrefix(t)), redisstore.WithPipeline(0, 0))
	ctx := context.Background()
	for _, tc := range []struct {
		limits []tollgate.Limit
		n      int
		want   error
	}{
		{[]tollgate.Limit{tollgate.PerSecond(1), tollgate.PerSecond(2)}, 1, tollgate.ErrInvalidLimit},
		{nil, 1, tollgate.ErrInvalidLimit},
		{[]tollgate.Limit{tollgate.PerSecond(10), tollgate.PerMinute(5)}, 6, tollgate.ErrCostExceedsBurst},
	} {
		if _, err := st.AllowAll(ctx, "k", tc.limits, tc.n, nil); !errors.Is(err, tc.want) {
			t.Errorf("%v n %d: %v, want %v", tc.limits, tc.n, err, tc.want)
		}
	}
	if calls := hook.take(); len(calls) != 0 {
		t.Errorf("script calls for refused sets: %v, want none", calls)
	}
}

// The all-or-nothing race re-executes this test binary as two children
// that ask one key for a plan; allChildEnv holds "addr key seconds".
const allChildEnv = "TOLLGATE_ALL_CHILD"

// allPlan is the plan the children ask: at most 10 requests in any second
// and 100 in any minute, each a sliding window log, whose entries are the
// admissions themselves.
var allPlan = []tollgate.Limit{
	{Algorithm: tollgate.SlidingWindowLog, Rate: 10, Period: time.Second},
	{Algorithm: tollgate.SlidingWindowLog, Rate: 100, Period: time.Minute},
}

// allChild runs in a child process: 8 goroutines ask for the plan until the
// time is up, then it prints how many requests were admitted, denied and
// failed.
func allChild() {
	f := strings.Fields(os.Getenv(allChildEnv))
	secs, _ := strconv.Atoi(f[2])
	rdb := redis.NewClient(&redis.Options{Addr: f[0]})
	defer rdb.Close()
	s := redisstore.New(rdb)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	waitGo()
	var admitted, denied, failed atomic.Int64
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var buf [2]tollgate.Result
			for time.Now().Before(end) {
				rs, err := s.AllowAll(ctx, f[1], allPlan, 1, buf[:0])
				switch {
				case err != nil:
					failed.Add(1)
				case rs[0].Allowed && rs[1].Allowed:
					admitted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Println(admitted.Load(), denied.Load(), failed.Load())
}

// TestAllowAllTwoProcesses: two processes, 8 goroutines each, ask one key
// for 10 a second and 100 a minute, all or nothing, for 11 seconds. The
// minute's log, which holds every admission, must hold exactly what the
// children were admitted, and that must be 100 (the minute's cap, reached
// after 10 seconds of 10); no second of it may hold more than 10; and the
// second's log must hold only admissions the minute's log holds too: a
// request the minute denied spent nothing of the second.
func TestAllowAllTwoProcesses(t *testing.T) {
	t.Parallel()
	key := testkit.KeyPrefix(t) + "plan"
	spec := fmt.Sprintf("%s=%s %s %d", allChildEnv, server.Addr(), key, 11)
	st := redisstore.New(server.Client(t))
	times := func(l tollgate.Limit) []float64 {
		t.Helper()
		zs, err := server.Client(t).ZRangeWithScores(context.Background(), st.Key(key, l), 0, -1).Result()
		if err != nil {
			t.Error(err)
		}
		out := make([]float64, len(zs))
		for i, z := range zs {
			out[i] = z.Score
		}
		return out
	}
	// The second's log lives a second past its newest entry: look at it
	// every 50 ms while the children run, and keep every entry seen.
	seen := map[string]float64{}
	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			zs, _ := server.Client(t).ZRangeWithScores(context.Background(), st.Key(key, allPlan[0]), 0, -1).Result()
			for _, z := range zs {
				seen[z.Member.(string)] = z.Score
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	var total, denials int64
	for i, c := range startTogether(t, spec, spec) {
		out, _ := io.ReadAll(c.out)
		if err := c.wait(); err != nil {
			t.Fatalf("child %d: %v: %s", i, err, out)
		}
		var a, d, f int64
		if _, err := fmt.Sscan(string(out), &a, &d, &f); err != nil || f != 0 {
			t.Fatalf("child %d printed %q (%v): want no failures", i, out, err)
		}
		if a == 0 {
			t.Errorf("child %d was admitted nothing: did both take part?", i)
		}
		total, denials = total+a, denials+d
	}
	close(done)
	watch.Wait()
	minute := times(allPlan[1])
	if total != 100 || int64(len(minute)) != total {
		t.Errorf("%d admitted, the minute's log holds %d: want 100 and 100", total, len(minute))
	}
	for i := range minute {
		j := i
		for j+1 < len(minute) && minute[j+1] < minute[i]+1e6 {
			j++
		}
		if j-i+1 > 10 {
			t.Fatalf("%d admissions within a second from %.0f µs: want at most 10", j-i+1, minute[i])
		}
	}
	inMinute := map[float64]int{}
	for _, m := range minute {
		inMinute[m]++
	}
	for _, s := range seen {
		if inMinute[s]--; inMinute[s] < 0 {
			t.Fatalf("the second's log held an admission at %.0f µs the minute's does not: a request the minute denied spent the second", s)
		}
	}
	if len(seen) < 50 {
		t.Errorf("the second's log was seen to hold %d admissions, want most of the 100", len(seen))
	}
	t.Logf("%d admitted, %d denied; %d admissions seen in the second's log", total, denials, len(seen))
}
