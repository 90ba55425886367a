package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// settleStep is one call at T0+at: a decision (AllowN), a reservation
// (ReserveN) or a settle of a reservation made at T0+resAt of cost n whose
// actual cost was actual. want is its Result; a settle's is always a look.
type settleStep struct {
	at     time.Duration
	op     string // "allow", "reserve" or "settle"
	n      int
	actual int
	resAt  time.Duration
	want   want
	// same: the call must leave the key's value and TTL as they were
	// (DUMP), its TTL as a look sets it; gone: no key afterwards; card, when above 0: the number of
	// entries of a sliding window log afterwards.
	same, gone bool
	card       int64
	// under, when set, is the limit of this step instead of the case's.
	under tollgate.Limit
}

type want struct {
	allowed       bool
	remaining     int
	retry, reset  time.Duration
	delay         time.Duration
	checkDelayToo bool
}

func ok(remaining int, reset time.Duration) want {
	return want{allowed: true, remaining: remaining, reset: reset}
}

func deny(retry, reset time.Duration) want { return want{retry: retry, reset: reset} }

// The cases count in hours where their comments say seconds: Redis expires
// keys in real time while the test's clock stands still, and a state must
// outlive a slow machine between two steps. sec is the cases' second, ms
// their millisecond.
const (
	sec = time.Hour
	ms  = sec / 1000
	// bigPeriod is odd and prime to 115: a unit of one period a token.
	bigPeriod = 10802237922549 * time.Microsecond
)

// settleCases are worked by hand from the Settler contract, in the limits'
// own units: for 10 per second a token is 100ms of refill.
var settleCases = []struct {
	name  string
	limit tollgate.Limit
	steps []settleStep
}{
	{"token bucket", tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: sec, Burst: 10}, bucketSteps},
	{"leaky bucket policer", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: sec, Burst: 10}, bucketSteps},
	{"gcra", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 10, Period: sec, Burst: 10}, append(bucketSteps[:len(bucketSteps)-3:len(bucketSteps)-3],
		// The clock steps back: GCRA keeps the TAT, so the half second the
		// clock went back counts against the key (token_bucket's time
		// stands still instead).
		settleStep{at: 6 * sec, op: "reserve", n: 4, want: ok(6, 400*ms)},
		settleStep{at: 5500 * ms, op: "settle", n: 4, actual: 2, resAt: 6 * sec, want: ok(3, 700*ms)},
		settleStep{at: 5500 * ms, op: "allow", n: 4, want: want{remaining: 3, retry: 100 * ms, reset: 700 * ms}},
	)},
	// A debt kept under one rate and read under another is converted
	// exactly, rounded to the larger debt, and to at most the new limit's
	// MaxDebt: 10 tokens owed at 10 per second are 10 owed at 20 per second
	// (11 tokens to wait for, at 50ms each). 10,000,000 owed are at most
	// 101,999 owed at 999,983 per second with burst 2,400,000, whose tokens
	// count in units so fine (3,600,000,000 a token) that a larger debt
	// would not count exactly below 2^53.
	{"token bucket debt under a new rate", tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: sec, Burst: 10}, []settleStep{
		{op: "settle", n: 1, actual: 30, want: ok(0, 2*sec)},
		{op: "allow", n: 1, want: deny(550*ms, sec), under: tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 20, Period: sec, Burst: 10}},
		// A lowered burst (4, MaxDebt 4) forgives all but 4 of the debt.
		{op: "allow", want: ok(0, 800*ms), under: tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: sec, Burst: 4}},
	}},
	// A charge never lowers what a key spent: a key filled beyond the cap
	// of a lowered limit stays where it is.
	{"leaky bucket above a lowered cap", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: sec, Burst: 10}, []settleStep{
		{op: "settle", n: 1, actual: 30, want: ok(0, 2*sec)},
		{op: "settle", n: 1, actual: 2, want: ok(0, 2*sec), under: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: sec, Burst: 4}},
	}},
	{"gcra above a lowered cap", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 10, Period: sec, Burst: 10}, []settleStep{
		{op: "settle", n: 1, actual: 30, want: ok(0, 2*sec)},
		{op: "settle", n: 1, actual: 2, want: ok(0, 2*sec), under: tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 10, Period: sec, Burst: 4}},
	}},
	{"fixed window above a lowered cap", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: sec}, []settleStep{
		{op: "settle", n: 1, actual: 30, want: ok(0, sec)},
		{op: "settle", n: 1, actual: 2, want: ok(0, sec), under: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 2, Period: sec}},
		// The count stayed 10.
		{op: "allow", want: ok(2, sec), under: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 12, Period: sec}},
	}},
	{"token bucket debt clamped under a new rate", tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10_000_000, Period: sec, Burst: 10_000_000}, []settleStep{
		{op: "settle", n: 1, actual: 30_000_000, want: ok(0, 2*sec)},
		// ⌈(2,400,000 + 101,999) × 3,600,000,000 ÷ 999,983⌉ µs to refill.
		{op: "allow", want: ok(0, 9007349525*time.Microsecond), under: tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 999_983, Period: sec, Burst: 2_400_000}},
	}},
	// A leaky bucket's level kept under one limit is read whole by another
	// of the same period and unit (period ÷ gcd(rate, period)) and another
	// rate: 833 tokens charged at 115 per P (bound 727 + 106) are
	// 8,998,264,189,483,317 units, so close to 2^53 that the level plus a
	// request's cost is not a double. At 2 per P the read caps it at what
	// drains in 2^47µs, 2^48 units; with a request of 6 that is 2^48 − 3P
	// units above the burst of 9, which drain at 2 units a µs.
	{"leaky bucket full to 2^53 under another rate", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 115, Period: bigPeriod, Burst: 727}, []settleStep{
		{op: "settle", n: 1, actual: 2186, want: ok(0, 78245775560725*time.Microsecond)},
		{op: "allow", n: 6, want: deny(124534131471505*time.Microsecond, 140737488355328*time.Microsecond), under: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: bigPeriod, Burst: 9}},
	}},
	{"token bucket without state", tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: sec, Burst: 10}, freshSteps},
	{"gcra without state", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 10, Period: sec, Burst: 10}, freshSteps},
	{"leaky bucket without state", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: sec, Burst: 10}, freshSteps},
	{"gcra fractions", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 3, Period: sec + time.Microsecond, Burst: 5}, []settleStep{
		// The interval T is 1,200,000,000⅓ µs.
		{op: "reserve", n: 1, want: ok(4, 1200000001*time.Microsecond)},
		// Two intervals more: the TAT is 3T = 3,600,000,001 µs exactly.
		{op: "settle", n: 1, actual: 3, want: ok(2, 3600000001*time.Microsecond)},
		{op: "settle", n: 3, actual: 1, want: ok(4, 1200000001*time.Microsecond)},
		// A charge of min(20, 5 + 5 + 1) − 1 = 10: the TAT at most
		// Burst + MaxDebt = 10 intervals ahead, 12,000,000,003⅓ µs.
		{op: "settle", n: 1, actual: 20, want: ok(0, 12000000004*time.Microsecond)},
		// Admitted once the TAT is within 4 intervals: at 6T.
		{op: "allow", n: 1, want: deny(7200000002*time.Microsecond, 12000000004*time.Microsecond)},
		{at: 7200000002 * time.Microsecond, op: "allow", want: ok(1, 4800000002*time.Microsecond)},
	}},
	{"leaky bucket shaper", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: sec, Burst: 2, MaxDelay: sec}, []settleStep{
		// Capacity 2 + 10 queued within a second = 12, MaxDebt 12.
		{op: "reserve", n: 5, want: want{allowed: true, reset: 500 * ms, delay: 300 * ms, checkDelayToo: true}},
		// A charge of min(30, 24 + 5) − 5 = 24, to at most 24.
		{op: "settle", n: 5, actual: 30, want: ok(0, 2400*ms)},
		{op: "allow", n: 1, want: deny(1300*ms, 2400*ms)},
		{op: "settle", n: 5, actual: 0, want: ok(0, 1900*ms)},
		{at: 1800 * ms, op: "allow", n: 1, want: want{allowed: true, reset: 200 * ms, checkDelayToo: true}},
	}},
	{"fixed window", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: sec}, []settleStep{
		{at: 100 * ms, op: "reserve", n: 3, want: ok(2, 900*ms)},
		{at: 200 * ms, op: "settle", n: 3, actual: 1, resAt: 100 * ms, want: ok(4, 800*ms)},
		{at: 300 * ms, op: "settle", n: 1, actual: 4, resAt: 100 * ms, want: ok(1, 700*ms)},
		// A charge of min(20, 5 + 5 + 1) − 1 = 10, the count to at most 10.
		{at: 300 * ms, op: "settle", n: 1, actual: 20, resAt: 100 * ms, want: ok(0, 700*ms)},
		{at: 300 * ms, op: "allow", n: 1, want: deny(700*ms, 700*ms)},
		// The reservation's window ended: the refund changes a count that
		// no longer counts, and the key is left to expire.
		{at: 1200 * ms, op: "settle", n: 3, actual: 0, resAt: 100 * ms, want: ok(5, 0)},
		// A charge counts in the window of the settle, a fresh one.
		{at: 1300 * ms, op: "settle", n: 1, actual: 3, resAt: 100 * ms, want: ok(3, 700*ms)},
		{at: 1400 * ms, op: "reserve", n: 1, want: ok(2, 600*ms)},
		// The stored window is not the reservation's: nothing.
		{at: 1400 * ms, op: "settle", n: 3, actual: 0, resAt: 100 * ms, want: ok(2, 600*ms), same: true},
		// The clock stepped back into window 0: the charge counts in the
		// newer stored window 1.
		{at: 500 * ms, op: "settle", n: 1, actual: 2, resAt: 1400 * ms, want: ok(1, 1500*ms)},
	}},
	{"sliding window counter", tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 10, Period: sec}, []settleStep{
		{at: 100 * ms, op: "reserve", n: 6, want: ok(4, 1900*ms)},
		{at: 100 * ms, op: "settle", n: 6, actual: 2, resAt: 100 * ms, want: ok(8, 1900*ms)},
		// Window 1, half way: the previous window's 2 weigh 1.
		{at: 1500 * ms, op: "allow", n: 1, want: ok(8, 1500*ms)},
		// The reservation's window is now the previous one.
		{at: 1500 * ms, op: "settle", n: 6, actual: 0, resAt: 100 * ms, want: ok(9, 1500*ms)},
		// A charge of min(30, 10 + 10 + 1) − 1 = 20, the count to at most 20.
		{at: 1500 * ms, op: "settle", n: 1, actual: 30, resAt: 1500 * ms, want: ok(0, 1500*ms)},
		// 21 > 10: in window 2, once 20 × (1 − step) ≤ 9: step 0.55.
		{at: 1500 * ms, op: "allow", n: 1, want: deny(1050*ms, 1500*ms)},
		// Window 2, half way: the 20 weigh 10.
		{at: 2500 * ms, op: "allow", want: ok(0, 500*ms)},
		// The stored window (1) is the reservation's, and now the previous
		// one: 15 weigh 7.5.
		{at: 2500 * ms, op: "settle", n: 5, actual: 0, resAt: 1500 * ms, want: ok(2, 500*ms)},
		// The stored window (1) has expired, at the end of window 2:
		// nothing to refund, and the settle that finds it so deletes it.
		{at: 3500 * ms, op: "settle", n: 5, actual: 0, resAt: 3500 * ms, want: ok(10, 0), gone: true},
	}},
	{"sliding window log", tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 5, Period: sec}, []settleStep{
		{at: 100 * ms, op: "reserve", n: 3, want: ok(2, sec)},
		{at: 200 * ms, op: "reserve", n: 1, want: ok(1, sec)},
		{at: 300 * ms, op: "settle", n: 3, actual: 1, resAt: 100 * ms, want: ok(3, 900*ms), card: 2},
		// Only one entry of its instant is left to remove.
		{at: 300 * ms, op: "settle", n: 3, actual: 0, resAt: 100 * ms, want: ok(4, 900*ms), card: 1},
		{at: 300 * ms, op: "settle", n: 3, actual: 0, resAt: 100 * ms, want: ok(4, 900*ms), same: true},
		{at: 500 * ms, op: "reserve", n: 3, want: ok(1, sec)},
		{at: 500 * ms, op: "settle", n: 3, actual: 1, resAt: 500 * ms, want: ok(3, sec), card: 2},
		// Added after the two removed: none merges with one left.
		{at: 500 * ms, op: "reserve", n: 2, want: ok(1, sec), card: 4},
		// A charge of 10, up to Rate + MaxDebt = 10 entries: 6 added.
		{at: 600 * ms, op: "settle", n: 1, actual: 20, resAt: 500 * ms, want: ok(0, sec), card: 10},
		// The 6th oldest entry (at 600ms) must leave the window.
		{at: 600 * ms, op: "allow", n: 1, want: deny(sec, sec)},
		// The entries at 200 and 500ms lapsed; the charge drops them.
		{at: 1550 * ms, op: "settle", n: 1, actual: 2, resAt: 1550 * ms, want: ok(0, sec), card: 7},
	}},
	{"sliding window log without state", tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 5, Period: sec}, []settleStep{
		{op: "settle", n: 3, actual: 0, want: ok(5, 0), gone: true},
		{at: 10 * ms, op: "settle", n: 1, actual: 4, resAt: 5 * ms, want: ok(2, sec), card: 3},
	}},
}

// bucketSteps work alike for a token bucket, a policing leaky bucket and
// GCRA of 10 per second, burst 10 (Capacity 10, MaxDebt 10).
var bucketSteps = []settleStep{
	{op: "reserve", n: 4, want: ok(6, 400*ms)},
	{op: "settle", n: 4, actual: 1, want: ok(9, 100*ms)},
	{op: "settle", n: 4, actual: 10, want: ok(3, 700*ms)},
	// A charge of min(20, 10 + 10 + 1) − 1 = 19, to a debt of at most 10.
	{op: "settle", n: 1, actual: 20, want: ok(0, 2*sec)},
	{op: "allow", n: 1, want: deny(1100*ms, 2*sec)},
	{at: 1500 * ms, op: "allow", want: ok(5, 500*ms)},
	// actual = reserved: a look that writes nothing.
	{at: 1500 * ms, op: "settle", n: 1, actual: 1, want: ok(5, 500*ms), same: true},
	// A refund into a full bucket: full, it has expired, and is deleted.
	{at: 5 * sec, op: "settle", n: 5, actual: 0, want: ok(10, 0), gone: true},
	// The clock steps back half a second after a reservation: time stands
	// still for the key, and the durations include the half second.
	{at: 6 * sec, op: "reserve", n: 4, want: ok(6, 400*ms)},
	{at: 5500 * ms, op: "settle", n: 4, actual: 2, resAt: 6 * sec, want: ok(8, 700*ms)},
	{at: 5500 * ms, op: "allow", n: 4, want: ok(4, 1100*ms)},
}

// freshSteps settle a key with no state: a refund writes nothing, a charge
// starts one.
var freshSteps = []settleStep{
	{op: "settle", n: 3, actual: 0, want: ok(10, 0), gone: true},
	{op: "settle", n: 1, actual: 4, want: ok(7, 300*ms)},
}

func TestSettleCases(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
		load   bool
	}{{"standalone", standalone, false}, {"standalone functions", standalone, true}, {"cluster", clustered, false}, {"cluster functions", clustered, true}} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range settleCases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					rdb := topo.client(t)
					clock := conformance.NewClock()
					s := redisstore.New(rdb, redisstore.WithClock(clock.Now))
					if topo.load {
						if err := s.Load(context.Background()); err != nil {
							t.Fatal(err)
						}
					}
					runSettleSteps(t, rdb, s, clock, key(t), tc.limit, tc.steps)
				})
			}
		})
	}
}

func runSettleSteps(t *testing.T, rdb redis.UniversalClient, s *redisstore.Store, clock *conformance.Clock, k string, limit tollgate.Limit, steps []settleStep) {
	t.Helper()
	ctx := context.Background()
	for i, st := range steps {
		clock.Set(st.at)
		limit := limit
		if st.under != (tollgate.Limit{}) {
			limit = st.under
		}
		name := s.Key(k, limit)
		before := dump(t, rdb, name)
		var (
			got tollgate.Result
			err error
		)
		switch st.op {
		case "allow":
			got, err = s.AllowN(ctx, k, limit, st.n)
		case "reserve":
			var at int64
			got, at, err = s.ReserveN(ctx, k, limit, st.n)
			if err == nil && at != clock.Now().UnixMicro() {
				t.Errorf("step %d: ReserveN at %d, want the clock's %d", i, at, clock.Now().UnixMicro())
			}
		case "settle":
			got, err = s.SettleN(ctx, k, limit, conformance.T0.Add(st.resAt).UnixMicro(), st.n, st.actual)
		}
		if err != nil {
			t.Fatalf("step %d (%s %d at T0+%v): %v", i, st.op, st.n, st.at, err)
		}
		w := st.want
		if got.Allowed != w.allowed || got.Remaining != w.remaining || got.RetryAfter != w.retry || got.ResetAfter != w.reset ||
			(w.checkDelayToo && got.Delay != w.delay) {
			t.Fatalf("step %d (%s %d→%d at T0+%v): got %+v, want %+v", i, st.op, st.n, st.actual, st.at, got, w)
		}
		switch {
		case st.same:
			if after := dump(t, rdb, name); string(after) != string(before) {
				t.Errorf("step %d: the key changed", i)
			}
			// A look sets the TTL to ResetAfter, in whole ms, when above 0.
			if want := (w.reset + time.Millisecond - 1).Truncate(time.Millisecond); w.reset > 0 {
				if ttl := rdb.PTTL(ctx, name).Val(); ttl > want || ttl < want-time.Second {
					t.Errorf("step %d: TTL %v, want %v", i, ttl, want)
				}
			}
		case st.gone:
			if n := rdb.Exists(ctx, name).Val(); n != 0 {
				t.Errorf("step %d: the key exists", i)
			}
		case st.op == "settle" && w.reset > 0:
			// The TTL a decision that wrote sets: ResetAfter in whole ms,
			// less the real time since (a second covers a slow machine).
			want := (w.reset + time.Millisecond - 1).Truncate(time.Millisecond)
			if ttl := rdb.PTTL(ctx, name).Val(); ttl > want || ttl < want-time.Second {
				t.Errorf("step %d: TTL %v, want %v", i, ttl, want)
			}
		}
		if st.card > 0 {
			if got, want := rdb.ZCard(ctx, name).Val(), st.card; got != want {
				t.Errorf("step %d: the log holds %d entries, want %d", i, got, want)
			}
		}
	}
}

// TestSettleInvalid: every argument CheckSettle rejects fails before
// anything reaches Redis, and no error names the key.
func TestSettleInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	k := "secret-api-key-" + key(t)
	limit := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: time.Second}
	now := time.Now().UnixMicro()
	for _, tc := range []struct {
		name             string
		key              string
		limit            tollgate.Limit
		at               int64
		reserved, actual int
		want             error
	}{
		{"no key", "", limit, now, 1, 1, tollgate.ErrInvalidKey},
		{"bad limit", k, tollgate.Limit{Rate: 0, Period: time.Second}, now, 1, 1, tollgate.ErrInvalidLimit},
		{"negative reserved", k, limit, now, -1, 1, tollgate.ErrInvalidCost},
		{"reserved above capacity", k, limit, now, 6, 1, tollgate.ErrCostExceedsBurst},
		{"negative actual", k, limit, now, 1, -1, tollgate.ErrInvalidCost},
		{"negative at", k, limit, -1, 1, 0, tollgate.ErrInvalidCost},
		{"at past 2250", k, limit, 1 << 53, 1, 0, tollgate.ErrInvalidCost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.SettleN(ctx, tc.key, tc.limit, tc.at, tc.reserved, tc.actual)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "redisstore: ") {
				t.Errorf("err = %q, want it to start with the package's name", err)
			}
		})
	}
	if n := rdb.Exists(ctx, s.Key(k, limit)).Val(); n != 0 {
		t.Errorf("an invalid settle wrote the key")
	}
}

// TestSettleCorrupt: a key tollgate did not write is an error that does not
// name the key, and stays as it was.
func TestSettleCorrupt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	clock := conformance.NewClock()
	s := redisstore.New(rdb, redisstore.WithClock(clock.Now))
	for _, a := range tollgate.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			k := "secret-api-key-" + key(t)
			limit := tollgate.Limit{Algorithm: a, Rate: 5, Period: time.Second}
			name := s.Key(k, limit)
			if a == tollgate.SlidingWindowLog {
				rdb.ZAdd(ctx, name, redis.Z{Score: float64(clock.Now().UnixMicro()), Member: "someone else's"})
			} else if a == tollgate.GCRA {
				rdb.Set(ctx, name, "someone else's", 0)
			} else {
				rdb.HSet(ctx, name, "t", "x", "l", "x", "w", "x", "c", "x", "p", "x", "ts", "x", "u", "x")
			}
			before := dump(t, rdb, name)
			_, err := s.SettleN(ctx, k, limit, clock.Now().UnixMicro(), 1, 3)
			if err == nil || strings.Contains(err.Error(), k) || !strings.Contains(err.Error(), "unexpected state") {
				t.Fatalf("err = %v, want an unexpected state that does not name the key", err)
			}
			if after := dump(t, rdb, name); string(after) != string(before) {
				t.Errorf("a failed settle changed the key")
			}
		})
	}
}

// TestReserveServerTime: without a clock, ReserveN returns the Redis
// server's TIME at the decision, alone and in a pipeline, and a settle at
// that time finds the reservation (a sliding window log's entries).
func TestReserveServerTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	limit := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 10, Period: time.Hour}
	for _, tc := range []struct {
		name string
		opts []redisstore.Option
	}{{"alone", nil}, {"pipelined", []redisstore.Option{redisstore.WithPipeline(time.Millisecond, 8)}}} {
		t.Run(tc.name, func(t *testing.T) {
			s := redisstore.New(rdb, tc.opts...)
			k := key(t)
			before, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			res, at, err := s.ReserveN(ctx, k, limit, 3)
			if err != nil || !res.Allowed {
				t.Fatalf("ReserveN: %+v, %v", res, err)
			}
			after, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if at < before.UnixMicro() || at > after.UnixMicro() {
				t.Errorf("ReserveN at %d, want the server's time, between %d and %d", at, before.UnixMicro(), after.UnixMicro())
			}
			res, err = s.SettleN(ctx, k, limit, at, 3, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.Remaining, 9; got != want {
				t.Errorf("Remaining after the refund = %d, want %d", got, want)
			}
		})
	}
}

// TestSettleFunctions: a settle calls the library's settle function once
// Load loaded it, and its script when the server lost the library, as a
// decision does.
func TestSettleFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.NewServer(t)
	rdb := srv.Client(t)
	h := &callHook{n: map[string]int{}}
	rdb.AddHook(h)
	s := redisstore.New(rdb)
	limit := tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	k := key(t)
	res, at, err := s.ReserveN(ctx, k, limit, 5)
	if err != nil || !res.Allowed {
		t.Fatalf("ReserveN: %+v, %v", res, err)
	}
	remaining := 5
	settle := func(step string, want map[string]int) {
		t.Helper()
		h.take()
		remaining++
		res, err := s.SettleN(ctx, k, limit, at, 2, 1) // a refund of 1
		if err != nil || res.Remaining != remaining {
			t.Fatalf("%s: %+v, %v; want %d remaining", step, res, err, remaining)
		}
		if got := h.take(); got["fcall"] != want["fcall"] || got["evalsha"] != want["evalsha"] || got["eval"] != want["eval"] {
			t.Errorf("%s: calls %v, want %v", step, got, want)
		}
	}
	settle("before Load", map[string]int{"evalsha": 1, "eval": 1})
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	settle("after Load", map[string]int{"fcall": 1})
	if err := rdb.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	settle("library lost", map[string]int{"fcall": 1, "evalsha": 1})
	settle("after the loss", map[string]int{"evalsha": 1})
}

// TestSettleModel runs the conformance's random reservations, settles,
// refunds and charges beyond the cap against the reference model, with
// every write's value and TTL checked in Redis (modelTarget).
func TestSettleModel(t *testing.T) {
	t.Parallel()
	s := modelSeedFor(t)
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		conformance.SettleModel(t, modelTarget(standalone), 4**modelSteps, s)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		conformance.SettleModel(t, modelTarget(clustered), 2**modelSteps, s+1)
	})
}

// TestSettleDifferential runs random decisions, reservations and settles of
// them through a Redis store and through memorystore on one clock, and
// requires the same Result of every call and the same instant from every
// ReserveN. As in conformance.Differential, the clock never runs slower
// than real time and never goes back, so a key Redis expired in real time
// is one memorystore expired on the clock, and each (algorithm, period)
// has one limit.
func TestSettleDifferential(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
		start  time.Time
		steps  int
		seed   uint64
	}{
		{"standalone", standalone, conformance.T0, 3000, 1},
		{"cluster", clustered, conformance.T0, 1500, 2},
		// A time in µs has 16 digits: the scripts must keep every one.
		{"year 2200", standalone, time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), 1500, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			settleDifferential(t, tc.client(t), tc.start, tc.steps, tc.seed)
		})
	}
}

func settleDifferential(t *testing.T, rdb redis.UniversalClient, start time.Time, steps int, seed uint64) {
	clock := conformance.NewClockAt(start)
	store := redisstore.New(rdb, redisstore.WithClock(clock.Now))
	ref := memorystore.New(memorystore.WithClock(clock.Now))
	rng := rand.New(rand.NewPCG(seed, 7))
	ctx := context.Background()
	prefix := key(t)
	limits := []tollgate.Limit{
		{Algorithm: tollgate.TokenBucket, Rate: 7, Period: time.Second, Burst: 5},
		{Algorithm: tollgate.GCRA, Rate: 7, Period: time.Second, Burst: 5},
		{Algorithm: tollgate.LeakyBucket, Rate: 7, Period: time.Second, Burst: 5},
		{Algorithm: tollgate.LeakyBucket, Rate: 14, Period: 2 * time.Second, Burst: 3, MaxDelay: 300 * time.Millisecond},
		{Algorithm: tollgate.FixedWindow, Rate: 6, Period: 700 * time.Millisecond},
		{Algorithm: tollgate.SlidingWindowCounter, Rate: 6, Period: 700 * time.Millisecond},
		{Algorithm: tollgate.SlidingWindowLog, Rate: 6, Period: 700 * time.Millisecond},
	}
	type reservation struct {
		key   string
		limit tollgate.Limit
		at    int64
		n     int
	}
	var (
		open    []reservation
		settles int
		offset  time.Duration // the random steps so far
	)
	began := time.Now()
	for i := range steps {
		switch r := rng.IntN(10); {
		case r < 4:
		case r < 7:
			offset += time.Duration(rng.IntN(1000)) * time.Microsecond
		case r < 9:
			offset += time.Duration(rng.IntN(200)) * time.Millisecond
		default:
			offset += time.Duration(rng.IntN(3000)) * time.Millisecond
		}
		clock.Set(time.Since(began).Truncate(time.Microsecond) + offset)
		var (
			got, want  tollgate.Result
			gerr, werr error
			line       string
		)
		if len(open) > 0 && rng.IntN(5) < 2 {
			j := rng.IntN(len(open))
			res := open[j]
			open = slices.Delete(open, j, j+1)
			actual := rng.IntN(3*res.n + 2)
			if rng.IntN(4) == 0 {
				actual = 0
			}
			line = fmt.Sprintf("settle %s reserved %d at %d, actual %d, under %v", res.key, res.n, res.at, actual, res.limit)
			got, gerr = store.SettleN(ctx, res.key, res.limit, res.at, res.n, actual)
			want, werr = ref.SettleN(ctx, res.key, res.limit, res.at, res.n, actual)
			settles++
		} else {
			k := fmt.Sprint(prefix, rng.IntN(3))
			limit := limits[rng.IntN(len(limits))]
			n := rng.IntN(int(limit.Capacity()) + 1)
			line = fmt.Sprintf("reserve %s %d under %v", k, n, limit)
			var gat, wat int64
			got, gat, gerr = store.ReserveN(ctx, k, limit, n)
			want, wat, werr = ref.ReserveN(ctx, k, limit, n)
			if gerr == nil && gat != wat {
				t.Fatalf("step %d: %s: ReserveN at %d, memorystore at %d", i, line, gat, wat)
			}
			if gerr == nil && got.Allowed && n > 0 {
				open = append(open, reservation{k, limit, gat, n})
			}
		}
		if (gerr == nil) != (werr == nil) || got != want {
			t.Fatalf("step %d at T0+%v: %s:\nredis  %+v (err %v)\nmemory %+v (err %v)", i, clock.Now().Sub(start), line, got, gerr, want, werr)
		}
	}
	t.Logf("%d calls, %d settles, over %v of the test's clock", steps, settles, clock.Now().Sub(start))
}

// TestReserveBatch: decisions batched into one script call each get the
// time they were made at: the one server time the batch read, or each its
// own clock value.
func TestReserveBatch(t *testing.T) {
	t.Parallel()
	s := redisstore.New(server.Client(t), redisstore.WithPipeline(time.Millisecond, 8))
	limit := tollgate.Limit{Rate: 10, Period: time.Second}
	t1, t2 := conformance.T0.Add(time.Second), conformance.T0.Add(2*time.Second)
	calls := []redisstore.BatchCall{
		{Key: key(t), Limit: limit, N: 1},
		{Key: key(t), Limit: limit, N: 2},
		{Key: key(t), Limit: limit, N: 1, Now: t1},
		{Key: key(t), Limit: limit, N: 3, Now: t2},
	}
	before := time.Now().Add(-time.Minute).UnixMicro()
	redisstore.ExecBatch(s, calls)
	for i, c := range calls {
		if c.Err != nil || !c.Res.Allowed {
			t.Fatalf("call %d: %+v, %v", i, c.Res, c.Err)
		}
	}
	if calls[0].At != calls[1].At || calls[0].At < before {
		t.Errorf("server times %d and %d, want one, the batch's, after %d", calls[0].At, calls[1].At, before)
	}
	for i, want := range map[int]int64{2: t1.UnixMicro(), 3: t2.UnixMicro()} {
		if got := calls[i].At; got != want {
			t.Errorf("call %d at %d, want its clock's %d", i, got, want)
		}
	}
}
