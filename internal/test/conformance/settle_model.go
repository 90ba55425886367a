package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/model"
)

// SettleModel runs, for every algorithm, steps random calls through the
// store target makes, which must be a tollgate.Settler, and through the
// reference model: reservations, plain decisions, settles of reservations
// made earlier (refunds whole and partial, the estimate exactly, extra
// charges, and charges beyond what a key may owe), under the limits and on
// the clock a Gen draws over the whole space of valid inputs (rate, burst
// and delay changes between a reservation and its settle, a clock that
// steps back, limits at the edges of what Validate accepts). Every Result
// must equal the model's, ReserveN must return the store's clock, and
// after every step a look at the key must report what the model's does,
// the state kept as long as the model keeps it (target's hooks, as in
// ModelDifferential).
func SettleModel(t *testing.T, target ModelTarget, steps int, seed uint64) {
	for _, alg := range tollgate.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			SettleDifferential(t, target, alg, rand.NewPCG(seed, uint64(alg)), steps)
		})
	}
}

// SettleDifferential is SettleModel for one algorithm, its random choices
// drawn from src (a NewByteSource for a fuzz target).
func SettleDifferential(t *testing.T, target ModelTarget, alg tollgate.Algorithm, src rand.Source, steps int) {
	settleModel(t, target, alg, src, steps)
}

// reservationMade is a reservation the run may settle.
type reservationMade struct {
	key   string
	limit tollgate.Limit
	at    int64
	n     int
}

func settleModel(t *testing.T, target ModelTarget, alg tollgate.Algorithm, src rand.Source, steps int) {
	clock := NewClock()
	store, ok := target.New(t, clock.Now).(tollgate.Settler)
	if !ok {
		t.Fatalf("%T is not a tollgate.Settler", target.New(t, clock.Now))
	}
	oracle := model.New()
	gen := NewGen(alg, src)
	rng := rand.New(rand.NewPCG(src.Uint64(), src.Uint64()))
	run := &settleRun{t: t, target: target, store: store, oracle: oracle, rng: rng, history: map[string][]string{}}
	prefix := fmt.Sprintf("settlemodel:%d:", rand.Int64())
	defer func() {
		t.Logf("%d settles: %d refunds, %d charges (%d beyond the cap), %d wrote, %d left the key denying a cost of 1", run.refunds+run.charges, run.refunds, run.charges, run.capped, run.writes, run.owing)
	}()
	for i := 0; i < steps; i++ {
		c := gen.Next()
		key := prefix + fmt.Sprint(c.Key)
		clock.Set(time.UnixMicro(c.Now).Sub(T0))
		r := rng.IntN(100)
		if r < 40 && len(run.open) > 0 {
			gen.Saw(run.settle(i, c.Now))
			continue
		}
		// A reservation, or now and then a plain decision.
		if got, ok := run.reserve(i, c, key, r < 90); ok {
			gen.Saw(got)
		}
	}
}

// settleRun is the store and the model under settleModel, and what the run
// has done so far.
type settleRun struct {
	t       *testing.T
	target  ModelTarget
	store   tollgate.Settler
	oracle  *model.Model
	rng     *rand.Rand
	open    []reservationMade
	history map[string][]string
	// How many settles refunded, charged (and up to the cap), wrote,
	// and left a key denying a request of 1: the run must reach them.
	refunds, charges, capped, writes, owing int
}

// settle settles one of the open reservations, drawn at random, at now
// (step i): on the store and on the model, which must agree.
func (run *settleRun) settle(i int, now int64) tollgate.Result {
	t, target, store, oracle, rng := run.t, run.target, run.store, run.oracle, run.rng
	j := rng.IntN(len(run.open))
	res := run.open[j]
	run.open = append(run.open[:j], run.open[j+1:]...)
	if rng.IntN(8) == 0 {
		// A charge with no reservation before it (reserved 0),
		// such as a gateway's stream-done hits.
		res.n, res.at = 0, 0
	}
	actual := drawActual(rng, res)
	line := fmt.Sprintf("at %d settle (reserved %d at %d, actual %d) %v", now, res.n, res.at, actual, res.limit)
	live := expireBefore(t, target, store, oracle, res.key, res.limit, now, rng.IntN(2) == 0)
	want, wrote, werr := oracle.SettleN(res.key, res.limit, res.at, res.n, actual, now)
	if werr != nil {
		t.Fatalf("step %d: the model refuses %s: %v", i, line, werr)
	}
	var before any
	if !wrote && target.Before != nil {
		before = target.Before(t, store, res.key, res.limit)
	}
	got, err := store.SettleN(context.Background(), res.key, res.limit, res.at, res.n, actual)
	run.history[res.key] = record(run.history[res.key], line, got, err)
	if err != nil || got != want {
		t.Fatalf("step %d: store and model differ (err %v):\n%s\nmodel: %s", i, err, strings.Join(run.history[res.key], "\n"), show(want))
	}
	run.count(res, actual, wrote, now)
	afterCall(t, target, store, oracle, i, res.key, res.limit, got, wrote, before, live, run.history)
	lookBoth(t, target, store, oracle, i, res.key, res.limit, now, run.history)
	return got
}

// count adds a settle of res by actual at now to what the run has
// covered.
func (run *settleRun) count(res reservationMade, actual int, wrote bool, now int64) {
	switch p, _ := res.limit.Params(); {
	case actual < res.n:
		run.refunds++
	case actual > res.n:
		run.charges++
		if int64(actual-res.n) > p.Capacity+p.MaxDebt {
			run.capped++
		}
	}
	if wrote {
		run.writes++
		if probe, _ := run.oracle.Clone().AllowN(res.key, res.limit, 1, now); !probe.Allowed {
			run.owing++
		}
	}
}

// reserve makes the call c on key at step i, a ReserveN when reserve is
// true and else an AllowN, on the store and on the model, which must
// agree; an admitted reservation joins the open ones. It reports false
// for a cost the model refuses (and the store with it).
func (run *settleRun) reserve(i int, c Call, key string, reserve bool) (tollgate.Result, bool) {
	t, target, store, oracle := run.t, run.target, run.store, run.oracle
	line := fmt.Sprintf("at %d reserve %d %v", c.Now, c.N, c.Limit)
	refused := c.N < 0 || int64(c.N) > model.Capacity(c.Limit)
	live := false
	if !refused {
		live = expireBefore(t, target, store, oracle, key, c.Limit, c.Now, run.rng.IntN(2) == 0)
	}
	want, werr := oracle.AllowN(key, c.Limit, c.N, c.Now)
	wrote := werr == nil && want.Allowed && c.N > 0
	var before any
	if !wrote && target.Before != nil {
		before = target.Before(t, store, key, c.Limit)
	}
	var (
		got tollgate.Result
		at  = c.Now
		err error
	)
	if reserve {
		got, at, err = store.ReserveN(context.Background(), key, c.Limit, c.N)
	} else {
		line = fmt.Sprintf("at %d allow %d %v", c.Now, c.N, c.Limit)
		got, err = store.AllowN(context.Background(), key, c.Limit, c.N)
	}
	run.history[key] = record(run.history[key], line, got, err)
	switch {
	case werr != nil:
		if !errCost(err) {
			t.Fatalf("step %d: the model refuses cost %d under %v, the store says %s, %v", i, c.N, c.Limit, show(got), err)
		}
		return got, false
	case err != nil || got != want:
		t.Fatalf("step %d: store and model differ (err %v):\n%s\nmodel: %s", i, err, strings.Join(run.history[key], "\n"), show(want))
	case at != c.Now:
		t.Fatalf("step %d: ReserveN returned the instant %d, want the store's clock %d", i, at, c.Now)
	}
	afterCall(t, target, store, oracle, i, key, c.Limit, got, wrote, before, live, run.history)
	if got.Allowed && c.N > 0 {
		run.open = append(run.open, reservationMade{key, c.Limit, at, c.N})
		if len(run.open) > 64 {
			run.open = run.open[1:] // never settled: that is allowed too
		}
	}
	return got, true
}

// drawActual returns an actual cost for res: nothing, less, the same,
// somewhat more, or far more than any key may owe.
func drawActual(rng *rand.Rand, res reservationMade) int {
	capacity := res.limit.Capacity()
	if res.n == 0 {
		return rng.IntN(2*capacity + 1)
	}
	switch r := rng.IntN(100); {
	case r < 20:
		return 0
	case r < 40:
		return rng.IntN(res.n)
	case r < 50:
		return res.n
	case r < 75:
		return res.n + 1 + rng.IntN(min(capacity, 20))
	case r < 90:
		return res.n + rng.IntN(2*capacity+1)
	default:
		return 3*capacity + 1 + rng.IntN(5)
	}
}

// afterCall calls target's After hook on a call's outcome; a store that forgot
// the key's state (it expired in real time) makes the model forget it too.
func afterCall(t *testing.T, target ModelTarget, s tollgate.Store, m *model.Model, i int, key string, l tollgate.Limit, r tollgate.Result, wrote bool, before any, live bool, history map[string][]string) {
	t.Helper()
	if target.After == nil {
		return
	}
	if target.After(t, s, key, l, r, wrote, before, expiryAfter(m, key, l, r, wrote, live)) {
		m.Reset(key, l)
		history[key] = record(history[key], "  (the store forgot the state: so does the model)", r, nil)
	}
}

// lookBoth looks at key on the store and on the model and requires the same
// Result: the state after a settle, as a look reports it.
func lookBoth(t *testing.T, target ModelTarget, s tollgate.Settler, m *model.Model, i int, key string, l tollgate.Limit, now int64, history map[string][]string) {
	t.Helper()
	// The settle just called on this key: nothing of it has expired that
	// it has not seen.
	live := expireBefore(t, target, s, m, key, l, now, false)
	want, werr := m.AllowN(key, l, 0, now)
	var before any
	if target.Before != nil {
		before = target.Before(t, s, key, l)
	}
	got, err := s.AllowN(context.Background(), key, l, 0)
	history[key] = record(history[key], fmt.Sprintf("at %d look %v", now, l), got, err)
	if werr != nil || err != nil || got != want {
		t.Fatalf("step %d: the state after the settle differs (err %v, %v):\n%s\nmodel: %s", i, err, werr, strings.Join(history[key], "\n"), show(want))
	}
	afterCall(t, target, s, m, i, key, l, got, false, before, live, history)
}

// record appends a call and its outcome to a key's history, keeping the
// last trailCalls.
func record(h []string, line string, r tollgate.Result, err error) []string {
	out := "  " + line + " -> " + show(r)
	if err != nil {
		out = "  " + line + " -> error " + err.Error()
	}
	if len(h) == trailCalls {
		h = append(h[:0:0], h[1:]...)
	}
	return append(h, out)
}
