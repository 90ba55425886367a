package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
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

// The concurrency race test re-executes this test binary as two worker
// processes sharing one key. A worker learns what to do from concChildEnv,
// and runs from init, before TestMain: it needs none of the servers TestMain
// starts.
const concChildEnv = "TOLLGATE_CONC_CHILD"

func init() {
	if spec := os.Getenv(concChildEnv); spec != "" {
		os.Exit(concChild(spec))
	}
}

const (
	concMax        = 5
	concLease      = 4 * time.Second // far above any request, so only a dead holder's permits lapse
	concWorkers    = 6               // goroutines per process
	concRequests   = 10_000          // in all, taken by either process as it is free
	concHoldAfter  = 2000            // the victim holds a permit for good after this many
	concMaxWorkDur = 3 * time.Millisecond
)

// concChild runs in a worker process: "addr key requests holdAfter". Once
// its sibling is ready too (waitGo), its goroutines take requests numbered 1..requests from a
// counter in Redis (INCR on <key>:tickets), as pods behind a load balancer
// share a stream of requests, so the survivor serves what the victim no
// longer can. For each, a goroutine acquires a slot
// (retrying after a short random backoff when denied), works for a random
// 0-3 ms, and releases it. It prints, unbuffered, one line per event:
//
//	a <id> <unix ns>   acquired (the time after Acquire returned)
//	e <id> <unix ns>   work done (the time before Release is sent)
//	r <id>             released
//	h <id>             holding this permit and never letting go
//	x <error>          a store call failed
//
// With holdAfter > 0, once that many requests are done one more goroutine
// acquires a permit, prints h, and sleeps: the parent kills the process
// then, as a pod that crashes mid-request.
func concChild(spec string) int {
	f := strings.Fields(spec)
	requests, _ := strconv.Atoi(f[2])
	holdAfter, _ := strconv.Atoi(f[3])
	rdb := redis.NewClient(&redis.Options{Addr: f[0], PoolSize: concWorkers + 2})
	defer rdb.Close()
	s := redisstore.New(rdb)
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		fmt.Println("x", err)
		return 1
	}
	waitGo()

	var done atomic.Int64
	var failed atomic.Bool
	acquire := func() (tollgate.Permit, bool) {
		for !failed.Load() {
			p, res, err := s.Acquire(ctx, f[1], concMax, concLease)
			if err != nil {
				fmt.Println("x", err)
				failed.Store(true)
				return p, false
			}
			if res.Allowed {
				fmt.Println("a", p.ID, time.Now().UnixNano())
				return p, true
			}
			// RetryAfter is when a lease ends; holders here release
			// within milliseconds, so back off briefly instead.
			time.Sleep(time.Duration(500+rand.IntN(1500)) * time.Microsecond)
		}
		return tollgate.Permit{}, false
	}
	var wg sync.WaitGroup
	for range concWorkers {
		wg.Go(func() {
			for {
				n, err := rdb.Incr(ctx, f[1]+":tickets").Result()
				if err != nil {
					fmt.Println("x", err)
					failed.Store(true)
					return
				}
				if n > int64(requests) {
					return
				}
				p, ok := acquire()
				if !ok {
					return
				}
				time.Sleep(rand.N(concMaxWorkDur))
				fmt.Println("e", p.ID, time.Now().UnixNano())
				if err := s.Release(ctx, p); err != nil {
					fmt.Println("x", err)
					failed.Store(true)
					return
				}
				fmt.Println("r", p.ID)
				done.Add(1)
			}
		})
	}
	if holdAfter > 0 {
		wg.Go(func() {
			for done.Load() < int64(holdAfter) && !failed.Load() {
				time.Sleep(time.Millisecond)
			}
			if p, ok := acquire(); ok {
				fmt.Println("h", p.ID)
				time.Sleep(time.Hour) // until killed
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		return 1
	}
	return 0
}

// concProc is what the parent learned from one worker's output.
type concProc struct {
	starts, ends map[string]int64 // unix ns, by permit ID
	released     map[string]bool
	held         string // the permit held for good, if any
	errs         []string
}

// TestConcurrencyTwoProcesses: two OS processes, 6 goroutines each, share
// max 5 slots of one key on one Redis, 10,000 requests of random duration
// in all. One process is killed (SIGKILL) mid-way while it holds permits.
// The number of requests in flight across both, from each request's
// start/end times, never exceeds 5; a watcher polling Redis never sees more
// than 5 permits; and the dead process's permits lapse within one lease, so
// all 5 slots can be taken again.
func TestConcurrencyTwoProcesses(t *testing.T) {
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	k := key(t)
	rkey := s.ConcurrencyKey(k)

	// The watcher: the set never holds more than max members (lapsed ones
	// included), and never more than max live ones by Redis time.
	stop := make(chan struct{})
	var peakMembers, peakLive, polls atomic.Int64
	watch := redis.NewScript(`local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
return {redis.call('ZCARD', KEYS[1]), redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')}`)
	var watcher sync.WaitGroup
	watcher.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			v, err := watch.Run(ctx, rdb, []string{rkey}).Int64Slice()
			if err != nil {
				t.Errorf("watcher: %v", err)
				return
			}
			polls.Add(1)
			for _, m := range []struct {
				peak *atomic.Int64
				v    int64
			}{{&peakMembers, v[0]}, {&peakLive, v[1]}} {
				if m.v > m.peak.Load() {
					m.peak.Store(m.v)
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	})

	procs := [2]*concProc{}
	var killedAt, deadAt, deadRedis time.Time
	var heldScore float64
	var heldErr error
	var runs sync.WaitGroup
	errs := make([]error, 2)
	kids := startTogether(t,
		fmt.Sprintf("%s=%s %s %d %d", concChildEnv, server.Addr(), k, concRequests, 0),
		fmt.Sprintf("%s=%s %s %d %d", concChildEnv, server.Addr(), k, concRequests, concHoldAfter)) // the victim
	for i, c := range kids {
		p := &concProc{starts: map[string]int64{}, ends: map[string]int64{}, released: map[string]bool{}}
		procs[i] = p
		runs.Go(func() {
			sc := bufio.NewScanner(c.out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) < 2 {
					p.errs = append(p.errs, sc.Text())
					continue
				}
				switch f[0] {
				case "a", "e":
					ns, _ := strconv.ParseInt(f[2], 10, 64)
					if f[0] == "a" {
						p.starts[f[1]] = ns
					} else {
						p.ends[f[1]] = ns
					}
				case "r":
					p.released[f[1]] = true
				case "h":
					p.held = f[1]
					killedAt = time.Now()
					_ = c.cmd.Process.Kill() // SIGKILL: no deferred Release runs
				default:
					p.errs = append(p.errs, sc.Text())
				}
			}
			errs[i] = c.wait()
			if i == 1 && p.held != "" {
				deadAt = time.Now()
				// Dead, and still holding its slot: only the lease frees it.
				heldScore, heldErr = rdb.ZScore(ctx, rkey, p.held).Result()
				if heldErr == nil {
					deadRedis, heldErr = rdb.Time(ctx).Result()
				}
			}
		})
	}
	runs.Wait()
	close(stop)
	watcher.Wait()

	survivor, victim := procs[0], procs[1]
	if errs[0] != nil || len(survivor.errs) > 0 {
		t.Fatalf("survivor: %v %q", errs[0], survivor.errs)
	}
	if len(victim.errs) > 0 || victim.held == "" || killedAt.IsZero() {
		t.Fatalf("victim: exit %v, errors %q, held %q: it was not killed holding a permit", errs[1], victim.errs, victim.held)
	}
	// Every request was served but those the victim had in flight when it
	// died (at most one per worker).
	served := len(survivor.released) + len(victim.released)
	if served > concRequests || served < concRequests-concWorkers {
		t.Errorf("%d requests served (survivor %d, victim %d), want %d less at most %d lost with the victim",
			served, len(survivor.released), len(victim.released), concRequests, concWorkers)
	}
	var after int // requests the survivor started after the victim died
	for _, s := range survivor.starts {
		if s > deadAt.UnixNano() {
			after++
		}
	}
	if after == 0 {
		t.Errorf("the survivor served nothing after the victim died")
	}

	// In flight at once, across both processes: each request from the end
	// of its Acquire to the start of its Release, both inside the time it
	// held its permit. The victim's unfinished requests end when it died.
	type event struct {
		at    int64
		delta int
	}
	var events []event
	var outstanding []string // the victim's permits it never released
	for _, p := range procs {
		for id, s := range p.starts {
			e, ok := p.ends[id]
			if !ok {
				e = max(s, deadAt.UnixNano())
			}
			events = append(events, event{s, 1}, event{e, -1})
			if p == victim && !p.released[id] {
				outstanding = append(outstanding, id)
			}
		}
	}
	// At one instant, starts count before ends: a request that starts the
	// nanosecond another ends was admitted before that one released.
	slices.SortFunc(events, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return b.delta - a.delta
	})
	inFlight, peak := 0, 0
	for _, e := range events {
		inFlight += e.delta
		peak = max(peak, inFlight)
	}
	t.Logf("%d requests served (victim %d, killed holding %d permits; survivor %d after the kill); peak in flight %d; watcher: %d polls, peak %d members, %d live",
		served, len(victim.released), len(outstanding), after, peak, polls.Load(), peakMembers.Load(), peakLive.Load())
	if peak > concMax {
		t.Errorf("%d requests in flight at once, max %d", peak, concMax)
	}
	if peak < 2 {
		t.Errorf("peak in flight %d: the requests never overlapped, the test proves nothing", peak)
	}
	if peakMembers.Load() > concMax || peakLive.Load() > concMax {
		t.Errorf("watcher saw %d permits (%d live), max %d", peakMembers.Load(), peakLive.Load(), concMax)
	}

	// The dead process's permits lapse within one lease of its death, and
	// then every slot can be taken again.
	if !slices.Contains(outstanding, victim.held) {
		t.Fatalf("the held permit %s is not among the victim's outstanding ones", victim.held)
	}
	if heldErr != nil {
		t.Fatalf("the held permit at the victim's death: %v", heldErr)
	}
	if exp := time.UnixMicro(int64(heldScore)); !exp.After(deadRedis) {
		t.Errorf("the held permit had lapsed (%v) when its holder died (%v): the test proves nothing", exp, deadRedis)
	}
	// From its death, not from the kill: a worker may have acquired a permit
	// between the signal and the end.
	time.Sleep(time.Until(deadAt.Add(concLease)))
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range outstanding {
		score, err := rdb.ZScore(ctx, rkey, id).Result()
		if err == redis.Nil {
			continue // already dropped
		}
		if err != nil {
			t.Fatal(err)
		}
		if exp := time.UnixMicro(int64(score)); exp.After(now) {
			t.Errorf("the dead process's permit %s is held until %v, past one lease after its death (%v)", id, exp, now)
		}
	}
	for i := range concMax {
		if _, res, err := s.Acquire(ctx, k, concMax, concLease); err != nil || !res.Allowed {
			t.Fatalf("slot %d one lease after the kill: %+v, %v", i, res, err)
		}
	}
}
