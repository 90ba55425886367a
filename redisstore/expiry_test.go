package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/model"
	"github.com/tollgate/tollgate/redisstore"
)

// TestBucketWithoutExpiry: a bucket stored without its expiry e, as
// tollgate wrote buckets before it stored e, decides as the model does
// while its state is live, and takes the model's expiry from the first call
// that sets its TTL: a write, a settle, or a denial or look that finds it
// not full. A look that finds it full leaves it as it is.
func TestBucketWithoutExpiry(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tb := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 10}
	tbWide := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 20}
	tbNarrow := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 2}
	lb := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 10}
	lbSlow := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: time.Second, Burst: 10}
	lbShaper := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 2, MaxDelay: time.Second}
	type call struct {
		at     time.Duration
		limit  tollgate.Limit
		n      int
		settle int // > 0: settle the first call's reservation to settle − 1 instead
	}
	for _, tc := range []struct {
		name  string
		first call // admitted, then its e deleted
		then  []call
	}{
		{"a look under the same limit", call{0, tb, 5, 0}, []call{{100 * ms, tb, 0, 0}, {200 * ms, tb, 1, 0}}},
		{"a look under a higher burst", call{0, tb, 5, 0}, []call{{100 * ms, tbWide, 0, 0}, {700 * ms, tbWide, 0, 0}}},
		{"a look that finds it full under a lower burst", call{0, tb, 5, 0}, []call{{100 * ms, tbNarrow, 0, 0}, {200 * ms, tb, 0, 0}}},
		{"a denial under a higher burst", call{0, tb, 10, 0}, []call{{100 * ms, tbWide, 15, 0}}},
		{"a write under a higher burst", call{0, tb, 5, 0}, []call{{100 * ms, tbWide, 1, 0}, {600 * ms, tbWide, 0, 0}}},
		{"a settle", call{0, tb, 5, 0}, []call{{100 * ms, tb, 0, 3}, {150 * ms, tb, 0, 0}}},
		{"a leaky bucket's look at a slower rate", call{0, lb, 5, 0}, []call{{100 * ms, lbSlow, 0, 0}, {2 * time.Second, lbSlow, 1, 0}}},
		{"a leaky bucket's denial", call{0, lb, 8, 0}, []call{{100 * ms, lb, 4, 0}, {200 * ms, lb, 3, 0}}},
		{"a shaper's delay", call{0, lbShaper, 2, 0}, []call{{50 * ms, lbShaper, 5, 0}, {100 * ms, lbShaper, 0, 0}}},
		{"a leaky bucket's settle", call{0, lb, 5, 0}, []call{{100 * ms, lb, 0, 9}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rdb := standalone(t)
			clock := conformance.NewClock()
			s := redisstore.New(rdb, redisstore.WithClock(clock.Now))
			m := model.New()
			k := key(t)
			name := s.Key(k, tc.first.limit)
			now := func() int64 { return clock.Now().UnixMicro() }
			_, at, err := s.ReserveN(ctx, k, tc.first.limit, tc.first.n)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.AllowN(k, tc.first.limit, tc.first.n, now()); err != nil {
				t.Fatal(err)
			}
			if err := toOldBucket(ctx, rdb, name, true); err != nil {
				t.Fatal(err)
			}
			for i, c := range tc.then {
				clock.Set(c.at)
				exp, held := m.Expiry(k, c.limit)
				live := held && now() < exp
				var got, want tollgate.Result
				var wrote bool
				if c.settle > 0 {
					got, err = s.SettleN(ctx, k, c.limit, at, tc.first.n, c.settle-1)
					want, wrote, _ = m.SettleN(k, c.limit, at, tc.first.n, c.settle-1, now())
				} else {
					got, err = s.AllowN(ctx, k, c.limit, c.n)
					want, _ = m.AllowN(k, c.limit, c.n, now())
					wrote = want.Allowed && c.n > 0
				}
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if got != want {
					t.Fatalf("call %d (at %v, n %d, %v):\n got %+v\nwant %+v", i, c.at, c.n, c.limit, got, want)
				}
				e, err := bucketInt(ctx, rdb, name, "e")
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Fatal(err)
				}
				next, held := m.Expiry(k, c.limit)
				switch set := wrote || live && want.ResetAfter > 0; {
				case !held:
					t.Fatalf("call %d: the model holds nothing: a case must keep the bucket live", i)
				case set && (err != nil || e != next):
					t.Errorf("call %d set the expiry: e = %d (%v), want the model's %d", i, e, err, next)
				case !set && i == 0 && err == nil:
					t.Errorf("call %d left the expiry as it was: e = %d, want none", i, e)
				}
			}
		})
	}
}

// TestExpiryOnServerClock: on the Redis server's clock, a call that sets a
// key's expiry sets it to the instant its state expires on that clock —
// the call's time plus its ResetAfter, a permit's lease end — rounded up to
// a millisecond, so that Redis never deletes a key whose state a later
// call would find live. Redis counts a relative TTL (PEXPIRE) from the ms
// its script started in, which may be before the ms of the script's TIME:
// such a key could go up to a millisecond early, and a TTL of one could
// delete it at once. Each limit's ResetAfter is a second and 999 µs, so
// that the instant rounds up into the next ms after almost any time of the
// call, and the key outlives the checks by far.
func TestExpiryOnServerClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := standalone(t)
	s := redisstore.New(rdb)
	const long = time.Second + 999*time.Microsecond
	check := func(t *testing.T, name string, at int64, reset time.Duration) {
		t.Helper()
		got, err := rdb.PExpireTime(ctx, name).Result()
		want := (at + int64(reset/time.Microsecond) + 999) / 1000
		if err != nil || got < 0 || got.Milliseconds() != want {
			t.Errorf("the key expires at %v ms (%v), want %d: the state's expiry, %d µs + %v, rounded up", got.Milliseconds(), err, want, at, reset)
		}
	}
	for _, l := range []tollgate.Limit{
		{Algorithm: tollgate.TokenBucket, Rate: 1, Period: long, Burst: 1},
		{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: long, Burst: 1},
		{Algorithm: tollgate.GCRA, Rate: 1, Period: long, Burst: 1},
		{Algorithm: tollgate.SlidingWindowLog, Rate: 1, Period: long},
		{Algorithm: tollgate.SlidingWindowCounter, Rate: 1, Period: long},
		{Algorithm: tollgate.FixedWindow, Rate: 1, Period: long},
	} {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			for range 5 {
				k := key(t)
				r, at, err := s.ReserveN(ctx, k, l, 1)
				if err != nil || !r.Allowed {
					t.Fatalf("%+v, %v", r, err)
				}
				check(t, s.Key(k, l), at, r.ResetAfter)
				if isBucket(l) { // a charge of one more: a debt, its own expiry
					r, at, err = redisstore.SettleAt(ctx, s, k, l, at, 1, 2)
					if err != nil {
						t.Fatal(err)
					}
					check(t, s.Key(k, l), at, r.ResetAfter)
				}
			}
		})
	}
	t.Run("permit", func(t *testing.T) {
		for range 5 {
			k := key(t)
			p, r, err := s.Acquire(ctx, k, 1, long)
			if err != nil || !r.Allowed {
				t.Fatalf("%+v, %v", r, err)
			}
			check(t, s.ConcurrencyKey(k), p.Expires.UnixMicro(), 0)
		}
	})
}
