// Package conformance is the one table of scenarios that every
// tollgate.Store must pass with identical results: memorystore, redisstore
// on a standalone Redis and redisstore on a Redis Cluster all run it (see
// their tests). The expected values are worked out by hand from each
// algorithm's definition, at fixed instants of an injected clock, so a
// scenario pins down semantics, not just agreement.
//
// Besides the table, Differential runs long random sequences through a
// store and through memorystore side by side and requires the same Result
// at every step, and Equivalences checks the identities between algorithms
// (a policing leaky bucket is a token bucket, and so is GCRA, at every
// rate).
package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

// T0 is the instant scenarios start at: midnight UTC, so it is the start of
// a window of every period used here.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a settable clock shared by a test and its store.
type Clock struct {
	mu   sync.Mutex
	base time.Time
	t    time.Time
}

// NewClock returns a Clock reading T0.
func NewClock() *Clock { return NewClockAt(T0) }

// NewClockAt returns a Clock reading base, which Set counts from.
func NewClockAt(base time.Time) *Clock { return &Clock{base: base, t: base} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set sets the clock to its base + d.
func (c *Clock) Set(d time.Duration) {
	c.mu.Lock()
	c.t = c.base.Add(d)
	c.mu.Unlock()
}

// Backend is a Store under test.
type Backend struct {
	// New returns a store reading time from now. Stores may be shared
	// between scenarios: every scenario uses keys of its own.
	New func(t *testing.T, now func() time.Time) tollgate.Store
	// TTL returns how long the store will keep key's state under limit, and
	// whether it keeps any; nil for a store whose state has no TTL to read
	// (tiered over memorystore: its global store's TTLs are checked on
	// their own backend).
	TTL func(t *testing.T, s tollgate.Store, key string, limit tollgate.Limit) (time.Duration, bool)
	// TTLSlack is how much shorter than ResetAfter a TTL may read, for
	// stores whose TTLs run on real time (Redis) while the test's clock
	// stands still.
	TTLSlack time.Duration
	// TTLGrain is the resolution TTLs are rounded up to (Redis: 1ms).
	TTLGrain time.Duration
	// Settles claims that the store is a tollgate.Settler: Run then fails
	// if it is not, rather than leave the settle scenarios out, as it does
	// for a store that is not a Settler and does not claim to be.
	Settles bool
}

const (
	ms = time.Millisecond
	us = time.Microsecond
)

// Run runs every scenario against b, and RunSettle's too when the store is
// a tollgate.Settler or b claims it Settles.
func Run(t *testing.T, b Backend) {
	clock := NewClock()
	store := b.New(t, clock.Now)
	ctx := context.Background()
	// Scenarios share the clock, so they run one after the other.
	for i, sc := range scenarios() {
		t.Run(sc.limit.Algorithm.String()+"/"+sc.name, func(t *testing.T) {
			key := fmt.Sprintf("conformance:%d:%d", i, rand.Int64())
			for j, st := range sc.steps {
				if sc.reset > 0 && j == sc.reset {
					if err := store.Reset(ctx, key, sc.limit); err != nil {
						t.Fatalf("Reset: %v", err)
					}
				}
				limit := sc.limit
				if st.limit != (tollgate.Limit{}) {
					limit = st.limit
				}
				time.Sleep(st.wait)
				clock.Set(st.at)
				got, err := store.AllowN(ctx, key, limit, st.n)
				if err != nil {
					t.Fatalf("step %d (at %v, n %d): %v", j, st.at, st.n, err)
				}
				want := st.want
				want.Limit = limit
				if got != want {
					t.Fatalf("step %d (at %v, n %d, %v):\n got %+v\nwant %+v", j, st.at, st.n, limit, got, want)
				}
				if got.Allowed && st.n > 0 {
					checkTTL(t, b, store, key, limit, got.ResetAfter)
				}
			}
		})
	}
	t.Run("invalid input changes nothing", func(t *testing.T) { invalid(t, store, clock) })
	if _, ok := store.(tollgate.Settler); ok || b.Settles {
		t.Run("settle", func(t *testing.T) { RunSettle(t, b) })
	}
}

// checkTTL requires the stored state to be kept exactly until it is back to
// full: ResetAfter, rounded up to the store's grain, less the slack.
func checkTTL(t *testing.T, b Backend, s tollgate.Store, key string, limit tollgate.Limit, reset time.Duration) {
	t.Helper()
	if b.TTL == nil {
		return
	}
	got, ok := b.TTL(t, s, key, limit)
	if !ok {
		if reset <= b.TTLSlack {
			return // a TTL this short may have run out, in real time, already
		}
		t.Fatalf("no TTL on %s state after a write (want %v)", limit.Algorithm, reset)
	}
	hi := reset
	if b.TTLGrain > 0 {
		hi = (reset + b.TTLGrain - 1) / b.TTLGrain * b.TTLGrain
	}
	if got > hi || got < reset-b.TTLSlack {
		t.Fatalf("TTL = %v, want %v (ResetAfter %v)", got, hi, reset)
	}
}

func invalid(t *testing.T, s tollgate.Store, clock *Clock) {
	ctx := context.Background()
	clock.Set(0)
	key := fmt.Sprintf("conformance:invalid:%d", rand.Int64())
	good := bucket
	long := string(make([]byte, tollgate.MaxKeyLen+1))
	for _, tc := range []struct {
		name  string
		key   string
		limit tollgate.Limit
		n     int
		want  error
	}{
		{"empty key", "", good, 1, tollgate.ErrInvalidKey},
		{"key too long", long, good, 1, tollgate.ErrInvalidKey},
		{"zero rate", key, tollgate.Limit{Rate: 0, Period: time.Second, Burst: 1}, 1, tollgate.ErrInvalidLimit},
		{"negative period", key, tollgate.Limit{Rate: 1, Period: -time.Second, Burst: 1}, 1, tollgate.ErrInvalidLimit},
		{"negative burst", key, tollgate.Limit{Rate: 1, Period: time.Second, Burst: -1}, 1, tollgate.ErrInvalidLimit},
		{"unknown algorithm", key, tollgate.Limit{Algorithm: 42, Rate: 1, Period: time.Second, Burst: 1}, 1, tollgate.ErrInvalidLimit},
		{"negative cost", key, good, -1, tollgate.ErrInvalidCost},
		{"cost above burst", key, good, 6, tollgate.ErrCostExceedsBurst},
		{"cost above window", key, tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: time.Second}, 4, tollgate.ErrCostExceedsBurst},
		{"cost above shaping queue", key, tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: time.Second, Burst: 1, MaxDelay: time.Second}, 4, tollgate.ErrCostExceedsBurst},
		{"sliding log above MaxLogRate", key, tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 300_000, Period: time.Minute}, 300_000, tollgate.ErrInvalidLimit},
	} {
		if _, err := s.AllowN(ctx, tc.key, tc.limit, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	// None of that spent anything.
	got, err := s.AllowN(ctx, key, good, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Remaining != good.Burst || got.ResetAfter != 0 {
		t.Errorf("after rejected calls: %+v, want a full, untouched bucket", got)
	}
}

// Differential runs a long random sequence of calls — random algorithms,
// limits, costs, keys, and a clock that stands still or moves forward in
// small and large steps — through the store b makes and through memorystore,
// and requires identical Results at every step. The clock starts at start.
//
// Redis expires keys in real time, memorystore on the test's clock. An
// expired state decides like a fresh one, so the two agree as long as the
// test's clock never runs slower than real time (it advances by the real
// time elapsed plus the random steps) and never goes back (after a state
// expired, going back would find it in one store and not the other); the
// scenarios cover backward clocks. For the same reason each (algorithm,
// period) has one limit here: a state's TTL is computed under the limit that
// wrote it.
func Differential(t *testing.T, b Backend, start time.Time, steps int, seed uint64) {
	clock := NewClockAt(start)
	store := b.New(t, clock.Now)
	ref := memorystore.New(memorystore.WithClock(clock.Now))
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ctx := context.Background()
	prefix := fmt.Sprintf("diff:%d:", rand.Int64())

	limits := []tollgate.Limit{
		{Algorithm: tollgate.TokenBucket, Rate: 7, Period: time.Second, Burst: 3},
		{Algorithm: tollgate.TokenBucket, Rate: 100, Period: time.Minute, Burst: 10},
		{Algorithm: tollgate.GCRA, Rate: 3, Period: time.Second, Burst: 4},
		{Algorithm: tollgate.GCRA, Rate: 10, Period: 2 * time.Second, Burst: 1},
		{Algorithm: tollgate.FixedWindow, Rate: 5, Period: time.Second},
		{Algorithm: tollgate.FixedWindow, Rate: 50, Period: 1500 * time.Millisecond},
		{Algorithm: tollgate.SlidingWindowLog, Rate: 5, Period: time.Second},
		{Algorithm: tollgate.SlidingWindowLog, Rate: 3, Period: 700 * time.Millisecond},
		{Algorithm: tollgate.SlidingWindowCounter, Rate: 6, Period: time.Second},
		{Algorithm: tollgate.SlidingWindowCounter, Rate: 9, Period: 333 * time.Millisecond},
		{Algorithm: tollgate.LeakyBucket, Rate: 3, Period: time.Second, Burst: 2},
		{Algorithm: tollgate.LeakyBucket, Rate: 5, Period: 3 * time.Second, Burst: 1, MaxDelay: 800 * time.Millisecond},
	}
	var virtual time.Duration
	begin := time.Now()
	for i := 0; i < steps; i++ {
		switch r := rng.IntN(100); {
		case r < 45: // the same instant, as far as the test can make it
		case r < 85:
			virtual += time.Duration(rng.IntN(300_000)) * time.Microsecond
		default:
			virtual += time.Duration(rng.IntN(3000)) * time.Millisecond
		}
		now := virtual + time.Since(begin).Truncate(time.Microsecond)
		clock.Set(now)
		limit := limits[rng.IntN(len(limits))]
		key := prefix + fmt.Sprint(rng.IntN(4))
		n := rng.IntN(limit.Capacity() + 1)
		want, werr := ref.AllowN(ctx, key, limit, n)
		got, gerr := store.AllowN(ctx, key, limit, n)
		if (werr == nil) != (gerr == nil) || got != want {
			t.Fatalf("step %d: %s key %s n %d at start%+v:\nstore  %+v (err %v)\nmemory %+v (err %v)", i, limit, key, n, now, got, gerr, want, werr)
		}
	}
}
