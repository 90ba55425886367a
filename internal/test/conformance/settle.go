package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// A settle scenario is a sequence of reservations, settles and looks on
// one key, at fixed instants of the test's clock, each with the Result
// worked out by hand from the Settler contract (see tollgate.Settler).

// settleOp is what a settle step does.
type settleOp uint8

const (
	opReserve settleOp = iota // ReserveN of cost n
	opSettle                  // SettleN of reservation res with actual n
	opLook                    // AllowN of cost 0
)

type settleStep struct {
	op   settleOp
	at   time.Duration
	n    int
	res  int // opSettle: the index of the reservation, in the order made
	want tollgate.Result
	// wrote: the settle wrote the state, so its TTL is a write's.
	wrote bool
	// wait is real time to let pass first (see step.wait).
	wait time.Duration
}

type settleScenario struct {
	name  string
	limit tollgate.Limit
	steps []settleStep
}

func reserve(at time.Duration, n int, want tollgate.Result) settleStep {
	return settleStep{op: opReserve, at: at, n: n, want: want}
}

// settle settles reservation res (numbered from 0 in the order made) with
// actual, writing; noop is a settle that changes nothing and reports a
// look.
func settle(at time.Duration, res, actual, remaining int, reset time.Duration) settleStep {
	return settleStep{op: opSettle, at: at, n: actual, res: res, wrote: true, want: tollgate.Result{Allowed: true, Remaining: remaining, ResetAfter: reset}}
}

func noop(at time.Duration, res, actual, remaining int, reset time.Duration) settleStep {
	st := settle(at, res, actual, remaining, reset)
	st.wrote = false
	return st
}

func look(at time.Duration, remaining int, reset time.Duration) settleStep {
	return settleStep{op: opLook, at: at, want: tollgate.Result{Allowed: true, Remaining: remaining, ResetAfter: reset}}
}

func admitted(remaining int, reset time.Duration) tollgate.Result {
	return tollgate.Result{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func refused(remaining int, retry, reset time.Duration) tollgate.Result {
	return tollgate.Result{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

func after(wait time.Duration, st settleStep) settleStep {
	st.wait = wait
	return st
}

// settleBucket are the settle steps of a token bucket of 2 per second,
// burst 5 (a token every 500ms, MaxDebt 5); a policing leaky bucket does
// exactly the same, and so does GCRA as long as the clock does not step
// back.
func settleBucket() []settleScenario {
	const s = time.Second
	return []settleScenario{
		{name: "refund", limit: bucket, steps: []settleStep{
			reserve(0, 4, admitted(1, 2000*ms)),
			settle(0, 0, 1, 4, 500*ms), // 3 back
			reserve(0, 5, refused(4, 500*ms, 500*ms)),
			reserve(0, 4, admitted(0, 2500*ms)),
			settle(250*ms, 2, 0, 4, 250*ms), // all 4 back, half a token refilled
			look(250*ms, 4, 250*ms),
		}},
		{name: "refund never above the burst", limit: bucket, steps: []settleStep{
			reserve(0, 2, admitted(3, 1000*ms)),
			settle(2*s, 0, 0, 5, 0), // full already: the refund is lost
			reserve(2*s, 5, admitted(0, 2500*ms)),
		}},
		{name: "actual equal to the estimate", limit: bucket, steps: []settleStep{
			reserve(0, 3, admitted(2, 1500*ms)),
			noop(500*ms, 0, 3, 3, 1000*ms),
		}},
		{name: "charge into a debt, waited out", limit: bucket, steps: []settleStep{
			reserve(0, 5, admitted(0, 2500*ms)),
			settle(0, 0, 8, 0, 4000*ms), // 3 owed: -3 tokens
			reserve(1*s, 1, refused(0, 1000*ms, 3000*ms)),
			look(1500*ms, 0, 2500*ms),
			reserve(2*s, 1, admitted(0, 2500*ms)),
		}},
		{name: "charge capped at MaxDebt", limit: bucket, steps: []settleStep{
			reserve(0, 5, admitted(0, 2500*ms)),
			settle(0, 0, 50, 0, 5000*ms), // owes 5, not 45
			reserve(1*s, 1, refused(0, 2000*ms, 4000*ms)),
		}},
		{name: "clock steps back", limit: bucket, steps: []settleStep{
			reserve(10*s, 5, admitted(0, 2500*ms)),
			settle(9*s, 0, 2, 3, 2000*ms), // time stands still at 10s
			reserve(9*s, 3, admitted(0, 3500*ms)),
			settle(9*s, 1, 5, 0, 4500*ms),
		}},
	}
}

// settleGCRAStepBack: GCRA counts the lag of a clock that stepped back
// against the key, so it differs from the token bucket there.
func settleGCRAStepBack() settleScenario {
	const s = time.Second
	return settleScenario{name: "clock steps back", limit: with(bucket, tollgate.GCRA), steps: []settleStep{
		reserve(10*s, 5, admitted(0, 2500*ms)), // TAT 12.5s
		settle(9*s, 0, 2, 1, 2000*ms),          // TAT 11s: 2s ahead
		reserve(9*s, 3, refused(1, 1000*ms, 2000*ms)),
		reserve(9*s, 1, admitted(0, 2500*ms)), // TAT 11.5s
		settle(9*s, 2, 3, 0, 3500*ms),         // TAT 12.5s, below the cap of 14s
		settle(9*s, 2, 50, 0, 5000*ms),        // the cap: 9s + 10 × 500ms
	}}
}

// expiredScenario: a settle on a key whose state has expired. A refund
// finds nothing and writes nothing; a charge starts a fresh state. 3 per
// 100ms (per 100ms, capacity 3) for every algorithm, so that Redis, whose
// TTLs run in real time, has expired the state after a short wait.
func expiredScenario(a tollgate.Algorithm, charged tollgate.Result) settleScenario {
	l := tollgate.Limit{Algorithm: a, Rate: 3, Period: 100 * ms, Burst: 3}
	if a == tollgate.FixedWindow || a == tollgate.SlidingWindowLog || a == tollgate.SlidingWindowCounter {
		l.Burst = 0
	}
	first := admitted(2, 100*ms)
	switch a {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
		first = admitted(2, 33334*us)
	case tollgate.SlidingWindowCounter:
		first = admitted(2, 200*ms)
	}
	st := settle(time.Second, 0, 3, charged.Remaining, charged.ResetAfter)
	return settleScenario{name: "settle after expiry", limit: l, steps: []settleStep{
		reserve(0, 1, first),
		after(250*ms, noop(time.Second, 0, 0, 3, 0)),
		st,
	}}
}

func settleScenarios() []settleScenario {
	const s = time.Second
	var out []settleScenario
	for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.LeakyBucket, tollgate.GCRA} {
		for _, sc := range settleBucket() {
			if a == tollgate.GCRA && sc.name == "clock steps back" {
				sc = settleGCRAStepBack()
			}
			sc.limit = with(sc.limit, a)
			out = append(out, sc)
		}
		out = append(out, expiredScenario(a, admitted(1, 66667*us)))
		// At the edge of what a double counts: a token is 31,536,000,000,000
		// parts at 9,999,991 a year, and (200 + MaxDebt) of them must stay
		// below 2^53: MaxDebt is 85, not the burst of 200.
		edge := tollgate.Limit{Algorithm: a, Rate: 9_999_991, Period: 365 * 24 * time.Hour, Burst: 200}
		out = append(out, settleScenario{name: "debt at the edge of 2^53", limit: edge, steps: []settleStep{
			reserve(0, 200, admitted(0, 630_720_568*us)),
			settle(0, 0, 1000, 0, 898_776_809*us), // 285 intervals: owes 85
			reserve(0, 1, refused(0, 271_209_845*us, 898_776_809*us)),
		}})
	}
	out = append(out,
		// 2/s, burst 1, up to 1s of delay: capacity 3, MaxDebt 3.
		settleScenario{name: "shaper", limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: s, Burst: 1, MaxDelay: s}, steps: []settleStep{
			reserve(0, 3, tollgate.Result{Allowed: true, Delay: s, ResetAfter: 1500 * ms}),
			settle(0, 0, 1, 0, 500*ms), // a level of 1: a look reports no delay
			reserve(0, 1, tollgate.Result{Allowed: true, Delay: 500 * ms, ResetAfter: 1000 * ms}),
			settle(0, 1, 5, 0, 3000*ms), // level 6 = capacity + MaxDebt
			reserve(1*s, 1, refused(0, 1000*ms, 2000*ms)),
			reserve(2*s, 1, tollgate.Result{Allowed: true, Delay: s, ResetAfter: 1500 * ms}),
		}},
		// 1/s, burst 70,368,744 (2^46µs' worth, to the second) and 2^46µs
		// of delay: capacity and MaxDebt are 140,737,488 each, a level
		// that drains in 2^48µs. A charge stops at what drains in 2^47µs
		// (140,737,488.355328 tokens), as every read caps a level.
		settleScenario{name: "charge capped at 2^47µs of draining", limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: s, Burst: 70_368_744, MaxDelay: 1 << 46 * us}, steps: []settleStep{
			reserve(0, 1, admitted(70_368_743, s)),
			settle(0, 0, 281_474_976, 0, 140737488355328*us),
			look(0, 0, 140737488355328*us),
			// The excess is 2^47 − 70,368,743 s; less 2^46µs of delay.
			reserve(0, 1, refused(0, 1177664*us, 140737488355328*us)),
			look(s, 0, 140737487355328*us),
		}},
		// 3 per 10s, MaxDebt 3.
		settleScenario{name: "fixed window", limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: 10 * s}, steps: []settleStep{
			reserve(1*s, 3, admitted(0, 9*s)),
			settle(2*s, 0, 1, 2, 8*s),
			reserve(2*s, 2, admitted(0, 8*s)),
			settle(3*s, 1, 6, 0, 7*s), // 7 is capped at 6
			reserve(9*s, 1, refused(0, 1*s, 1*s)),
			reserve(10*s, 1, admitted(2, 10*s)), // a new window owes nothing
			// A refund into a window the key has left changes nothing.
			reserve(21*s, 1, admitted(2, 9*s)),
			reserve(31*s, 1, admitted(2, 9*s)),
			noop(31*s, 4, 0, 2, 9*s),
			// One into its window after it ended is harmless.
			settle(45*s, 5, 0, 3, 0),
		}},
		settleScenario{name: "fixed window clock steps back", limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: 10 * s}, steps: []settleStep{
			reserve(45*s, 2, admitted(1, 5*s)),
			reserve(45*s, 1, admitted(0, 5*s)),
			// Back in window 3: the key stays in window 4.
			settle(38*s, 0, 0, 2, 12*s),
			settle(38*s, 1, 5, 0, 12*s),
		}},
		// 4 per 10s, weighed in 1ms steps; MaxDebt 4.
		settleScenario{name: "sliding counter", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 4, Period: 10 * s}, steps: []settleStep{
			reserve(12*s, 2, admitted(2, 18*s)),
			reserve(13*s, 2, admitted(0, 17*s)),
			settle(13*s, 0, 1, 1, 17*s),
			// Window 2: window 1 weighs 3 × 0.8.
			reserve(22*s, 1, admitted(0, 18*s)),
			// A refund into the previous window: 1 × 0.8 + 1.
			settle(22*s, 1, 0, 2, 18*s),
			// One into a window that no longer counts changes nothing.
			reserve(41*s, 1, admitted(3, 19*s)),
			reserve(61*s, 1, admitted(3, 19*s)),
			noop(61*s, 3, 0, 3, 19*s),
			settle(62*s, 4, 9, 0, 18*s), // 9 is capped at 8
			// Window 7 weighs 8 × 0.9 = 7.2: a request fits once it weighs
			// 3, at 76.25s.
			reserve(71*s, 1, refused(0, 5250*ms, 9*s)),
			reserve(76250*ms, 1, admitted(0, 13750*ms)),
		}},
		settleScenario{name: "sliding counter clock steps back", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 4, Period: 10 * s}, steps: []settleStep{
			reserve(95*s, 2, admitted(2, 15*s)),
			reserve(96*s, 1, admitted(1, 14*s)),
			// Back in window 8: the key stays in window 9.
			settle(88*s, 0, 0, 3, 22*s),
			settle(88*s, 1, 4, 0, 22*s),
		}},
		// 3 per 10s, MaxDebt 3: at most 6 entries.
		settleScenario{name: "sliding log", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 3, Period: 10 * s}, steps: []settleStep{
			reserve(1*s, 2, admitted(1, 10*s)),
			reserve(2*s, 1, admitted(0, 10*s)),
			settle(3*s, 0, 0, 2, 9*s),  // its two entries at 1s removed
			settle(4*s, 1, 5, 0, 10*s), // four more, at 4s
			reserve(12500*ms, 1, refused(0, 1500*ms, 1500*ms)),
			reserve(14*s, 1, admitted(2, 10*s)),
			settle(14*s, 3, 10, 0, 10*s), // 5 more: 6 entries
			// Its entries gone, a refund changes nothing.
			reserve(30*s, 1, admitted(2, 10*s)),
			noop(30*s, 3, 0, 2, 10*s),
		}},
		settleScenario{name: "sliding log clock steps back", limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 3, Period: 10 * s}, steps: []settleStep{
			reserve(50*s, 2, admitted(1, 10*s)),
			reserve(50*s, 1, admitted(0, 10*s)),
			// Back at 45s: the key's time stays 50s.
			settle(45*s, 0, 0, 2, 15*s),
			settle(45*s, 1, 4, 0, 15*s),
		}},
		expiredScenario(tollgate.FixedWindow, admitted(1, 100*ms)),
		expiredScenario(tollgate.SlidingWindowCounter, admitted(1, 200*ms)),
		expiredScenario(tollgate.SlidingWindowLog, admitted(1, 100*ms)),
	)
	return out
}

// RunSettle runs every settle scenario against the store b makes, which
// must be a tollgate.Settler: reservations, refunds, extra charges, debts
// waited out and capped, settles after the state expired, into windows
// that passed and after the clock stepped back, each Result worked out by
// hand. Run runs it too, on every store that is a Settler or whose Backend
// says it Settles.
func RunSettle(t *testing.T, b Backend) {
	clock := NewClock()
	store := b.New(t, clock.Now)
	s, ok := store.(tollgate.Settler)
	if !ok {
		t.Fatalf("%T is not a tollgate.Settler", store)
	}
	ctx := context.Background()
	for i, sc := range settleScenarios() {
		t.Run(sc.limit.Algorithm.String()+"/"+sc.name, func(t *testing.T) {
			key := fmt.Sprintf("settle:%d:%d", i, rand.Int64())
			type reservation struct {
				at int64
				n  int
			}
			var made []reservation
			for j, st := range sc.steps {
				time.Sleep(st.wait)
				clock.Set(st.at)
				var (
					got tollgate.Result
					err error
				)
				switch st.op {
				case opReserve:
					var at int64
					got, at, err = s.ReserveN(ctx, key, sc.limit, st.n)
					if err == nil && at != T0.Add(st.at).UnixMicro() {
						t.Fatalf("step %d: ReserveN at T0+%v returned the instant %d, want the store's clock %d", j, st.at, at, T0.Add(st.at).UnixMicro())
					}
					made = append(made, reservation{at, st.n})
				case opSettle:
					r := made[st.res]
					got, err = s.SettleN(ctx, key, sc.limit, r.at, r.n, st.n)
				default:
					got, err = s.AllowN(ctx, key, sc.limit, 0)
				}
				if err != nil {
					t.Fatalf("step %d (at %v, n %d): %v", j, st.at, st.n, err)
				}
				want := st.want
				want.Limit = sc.limit
				if got != want {
					t.Fatalf("step %d (at %v, n %d, %v):\n got %s\nwant %s", j, st.at, st.n, sc.limit, show(got), show(want))
				}
				if (st.wrote || st.op == opReserve && got.Allowed) && got.ResetAfter > 0 {
					checkTTL(t, b, store, key, sc.limit, got.ResetAfter)
				}
			}
		})
	}
	t.Run("invalid settles change nothing", func(t *testing.T) { invalidSettle(t, s, clock) })
}

func invalidSettle(t *testing.T, s tollgate.Settler, clock *Clock) {
	ctx := context.Background()
	clock.Set(0)
	key := fmt.Sprintf("settle:invalid:%d", rand.Int64())
	_, at, err := s.ReserveN(ctx, key, bucket, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		key              string
		limit            tollgate.Limit
		at               int64
		reserved, actual int
		want             error
	}{
		{"empty key", "", bucket, at, 2, 0, tollgate.ErrInvalidKey},
		{"invalid limit", key, tollgate.Limit{Rate: 0, Period: time.Second}, at, 2, 0, tollgate.ErrInvalidLimit},
		{"negative reserved", key, bucket, at, -1, 0, tollgate.ErrInvalidCost},
		{"reserved above burst", key, bucket, at, 6, 0, tollgate.ErrCostExceedsBurst},
		{"negative actual", key, bucket, at, 2, -1, tollgate.ErrInvalidCost},
		{"negative instant", key, bucket, -1, 2, 0, tollgate.ErrInvalidCost},
	} {
		if _, err := s.SettleN(ctx, tc.key, tc.limit, tc.at, tc.reserved, tc.actual); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	got, err := s.AllowN(ctx, key, bucket, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := admitted(3, 1000*ms); got.Remaining != want.Remaining || got.ResetAfter != want.ResetAfter {
		t.Errorf("after rejected settles: %s, want %s", show(got), show(want))
	}
}
