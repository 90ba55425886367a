package tiered_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
)

// transitions records breaker transitions and the log.
type transitions struct {
	mu   sync.Mutex
	seen []string
	log  bytes.Buffer
}

func (tr *transitions) record(from, to tiered.State) {
	tr.mu.Lock()
	tr.seen = append(tr.seen, from.String()+"→"+to.String())
	tr.mu.Unlock()
}

func (tr *transitions) list() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.seen, " ")
}

func (tr *transitions) Write(p []byte) (int, error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.log.Write(p)
}

func (tr *transitions) logged() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.log.String()
}

// TestDegradedMode stops the redis-server (a crash): decisions go on at the
// degraded limit (the limit ÷ instances), the breaker opens after three
// failures and stops calling Redis, a probe after the cool-down fails while
// Redis is down and succeeds after it is started again, and the breaker
// closes. Every transition is logged, counted and reported.
func TestDegradedMode(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	rdb, sent := counted(t, srv)
	tr := &transitions{}
	const coolDown = 300 * time.Millisecond
	s := tiered.New(redisstore.New(rdb),
		tiered.WithInstances(4),
		tiered.WithBreaker(3, coolDown),
		tiered.WithTimeout(200*time.Millisecond),
		tiered.WithStateChange(tr.record),
		tiered.WithLogger(slog.New(slog.NewTextHandler(tr, nil))),
	)
	ctx := context.Background()
	limit := tollgate.PerMinute(40) // 10 per instance when degraded
	k := key(t)
	if res, err := s.AllowN(ctx, k, limit, 1); err != nil || !res.Allowed || res.Remaining != 39 {
		t.Fatalf("with Redis up: %+v, %v", res, err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for i := 0; i < 30; i++ {
		start := time.Now()
		res, err := s.AllowN(ctx, k, limit, 1)
		if err != nil {
			t.Fatalf("call %d with Redis down: %v", i, err)
		}
		// A deadline that holds, not a speed: the margin is wide because
		// the machine running the tests may be busy.
		if took := time.Since(start); took > 200*time.Millisecond+time.Second {
			t.Errorf("call %d took %v, want at most the timeout (200ms) and a margin", i, took)
		}
		if res.Allowed {
			allowed++
		}
		if res.Limit.Rate != 10 || res.Limit.Burst != 10 {
			t.Fatalf("degraded decision under %v, want 10/m burst 10", res.Limit)
		}
	}
	if allowed != 10 {
		t.Errorf("%d allowed with Redis down, want 10 (40 ÷ 4 instances)", allowed)
	}
	st := s.Stats()
	if st.State != tiered.Open || st.BreakerOpened != 1 || st.GlobalErrors != 3 || st.Degraded != 30 {
		t.Errorf("after 30 calls with Redis down: %+v; want open, opened once, 3 errors, 30 degraded", st)
	}
	callsWhileOpen := sent.Load()

	// After the cool-down one call probes Redis, still down: open again.
	time.Sleep(coolDown + 50*time.Millisecond)
	if _, err := s.AllowN(ctx, k, limit, 1); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.State != tiered.Open || st.BreakerProbes != 1 || st.BreakerOpened != 2 {
		t.Errorf("after a failed probe: %+v", st)
	}
	if got := sent.Load(); got != callsWhileOpen+1 {
		t.Errorf("%d commands sent while open, want only the probe", got-callsWhileOpen)
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The restarted server has no scripts: load them, so that the probe is
	// one call, well within the timeout on a busy machine.
	if err := redisstore.New(rdb).Load(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(coolDown + 50*time.Millisecond)
	// The probe reaches the restarted (empty) server and closes the breaker.
	res, err := s.AllowN(ctx, k, limit, 1)
	if err != nil || !res.Allowed || res.Remaining != 39 || res.Limit != limit {
		t.Fatalf("probe after Start: %+v, %v; want admitted by Redis (empty, 39 left)", res, err)
	}
	st = s.Stats()
	if st.State != tiered.Closed || st.BreakerClosed != 1 || st.BreakerProbes != 2 {
		t.Errorf("after a good probe: %+v", st)
	}
	if got, want := tr.list(), "closed→open open→half-open half-open→open open→half-open half-open→closed"; got != want {
		t.Errorf("transitions %q, want %q", got, want)
	}
	for _, want := range []string{"breaker open: deciding locally", "probe of the global store failed", "breaker closed"} {
		if !strings.Contains(tr.logged(), want) {
			t.Errorf("log lacks %q:\n%s", want, tr.logged())
		}
	}
}

// TestPausedRedis: Redis hangs (SIGSTOP). Each decision waits at most the
// store's timeout, then is made locally; the caller's own shorter deadline
// is honoured too.
func TestPausedRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	const timeout = 100 * time.Millisecond
	s := tiered.New(redisstore.New(srv.Client(t)), tiered.WithTimeout(timeout), tiered.WithBreaker(1000, time.Second),
		tiered.WithLogger(slog.New(slog.DiscardHandler)))
	ctx := context.Background()
	if _, err := s.AllowN(ctx, key(t), tollgate.PerSecond(10), 1); err != nil {
		t.Fatal(err)
	}
	// That call, the connection's first, may itself have outlasted the
	// timeout on a busy machine: count from here.
	before := s.Stats()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume() //nolint:errcheck // the test is over either way
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, wait := ctx, timeout
			if i%2 == 1 { // half the callers have a shorter deadline of their own
				var cancel context.CancelFunc
				wait = 30 * time.Millisecond
				cctx, cancel = context.WithTimeout(ctx, wait)
				defer cancel()
			}
			start := time.Now()
			res, err := s.AllowN(cctx, key(t), tollgate.PerSecond(10), 1)
			// A deadline that holds, not a speed: the margin is wide because
			// the machine running the tests may be busy (a hang would be
			// go-redis's 3 s read timeout, or forever).
			if took := time.Since(start); took > wait+time.Second {
				t.Errorf("decision took %v with a deadline of %v", took, wait)
			}
			if err != nil || !res.Allowed {
				t.Errorf("degraded decision on a fresh key: %+v, %v", res, err)
			}
		}()
	}
	wg.Wait()
	if st := s.Stats(); st.Degraded-before.Degraded != 16 || st.GlobalErrors-before.GlobalErrors != 16 {
		t.Errorf("stats: %+v, want 16 degraded decisions after 16 errors since %+v", st, before)
	}
}

// TestWithoutDegradedMode returns the failure to the caller, fast while the
// breaker is open.
func TestWithoutDegradedMode(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	s := tiered.New(redisstore.New(srv.Client(t)), tiered.WithoutDegradedMode(), tiered.WithBreaker(2, time.Minute),
		tiered.WithLogger(slog.New(slog.DiscardHandler)))
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := s.AllowN(context.Background(), "k", tollgate.PerSecond(1), 1); err == nil {
			t.Fatalf("call %d with Redis down: err = nil", i)
		}
	}
	if st := s.Stats(); st.GlobalErrors != 2 || st.State != tiered.Open || st.Degraded != 0 {
		t.Errorf("stats: %+v", st)
	}
}

// TestLeaseOvershoot shows the worst case of token leases on real Redis
// with a fixed clock: three instances each hold a lease of K = 5 tokens
// taken when the bucket was low (one token spent from each, 4 held); the
// bucket refills to full; then every instance spends what it holds and the
// bucket's burst on top: burst + instances × (K − 1) at one instant, within
// the documented bound burst + K × instances.
func TestLeaseOvershoot(t *testing.T) {
	t.Parallel()
	const burst, k, instances = 20, 5, 3
	clock := newClock()
	rdb, sent := counted(t, server)
	global := redisstore.New(rdb, redisstore.WithClock(clock.Now))
	var stores []*tiered.Store
	for range instances {
		stores = append(stores, tiered.New(global, tiered.WithClock(clock.Now), tiered.WithLeases(k, 10*time.Minute), untimed))
	}
	limit := tollgate.Limit{Rate: burst, Period: time.Minute, Burst: burst} // a token every 3s
	key := key(t)
	ctx := context.Background()
	admit := func() int {
		n := 0
		for again := true; again; {
			again = false
			for _, s := range stores {
				res, err := s.AllowN(ctx, key, limit, 1)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					n++
					again = true
				}
			}
		}
		return n
	}
	for _, s := range stores {
		if res, err := s.AllowN(ctx, key, limit, 1); err != nil || !res.Allowed {
			t.Fatalf("first call: %+v, %v", res, err)
		}
	}
	if calls := sent.Load(); calls != instances {
		t.Fatalf("%d Redis calls for %d leases", calls, instances)
	}
	clock.Advance(2 * time.Minute) // the bucket is full again; the leases (10 min) still hold 4 each
	if got, want := admit(), burst+instances*(k-1); got != want {
		t.Errorf("admitted %d at one instant, want burst + instances × (K−1) = %d", got, want)
	}
	// Without leases the same instant admits exactly the burst.
	clock.Advance(time.Hour)
	plain := tiered.New(global, tiered.WithClock(clock.Now), untimed)
	stores = []*tiered.Store{plain, plain, plain}
	if got := admit(); got != burst {
		t.Errorf("without leases: admitted %d, want %d", got, burst)
	}
	// A lease's unspent tokens are lost when it expires: an instance that
	// spends 1 of a fresh lease and waits past its TTL takes a new one.
	clock.Advance(time.Hour)
	s := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithLeases(k, time.Second), untimed)
	for range 2 {
		if res, err := s.AllowN(ctx, key, limit, 1); err != nil || !res.Allowed {
			t.Fatalf("%+v, %v", res, err)
		}
		clock.Advance(2 * time.Second)
	}
	if st := s.Stats(); st.LeasesTaken != 2 || st.LeaseHits != 0 {
		t.Errorf("after the first lease expired: %+v, want 2 leases taken", st)
	}
}

// TestLeaseCalls: with leases of K, a steady client makes one Redis call per
// K decisions, and the answers carry what the global store had left plus
// what the lease holds.
func TestLeaseCalls(t *testing.T) {
	t.Parallel()
	clock := newClock()
	rdb, sent := counted(t, server)
	s := tiered.New(redisstore.New(rdb, redisstore.WithClock(clock.Now)), tiered.WithClock(clock.Now), tiered.WithLeases(10, time.Minute), untimed)
	limit := tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 1000, Period: time.Second, Burst: 100}
	key := key(t)
	for i := 0; i < 100; i++ {
		res, err := s.AllowN(context.Background(), key, limit, 1)
		if err != nil || !res.Allowed {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
		if got, want := res.Remaining, 99-i; got != want {
			t.Fatalf("call %d: Remaining %d, want %d", i, got, want)
		}
	}
	if got := sent.Load(); got != 10 {
		t.Errorf("%d Redis calls for 100 decisions with leases of 10", got)
	}
	// The bucket is empty: a denial, remembered.
	res, err := s.AllowN(context.Background(), key, limit, 1)
	if err != nil || res.Allowed || res.RetryAfter != time.Millisecond {
		t.Errorf("past the burst: %+v, %v; want denied, retry in 1ms", res, err)
	}
}

func newClock() *testkit.Clock { return testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) }
