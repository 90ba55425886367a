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

// allSlots is how many limits ModelAll draws its sets from: each evolves
// as a Gen's limit does, one algorithm each.
const allSlots = 4

// ModelAll sends random sets of limits through the AllowAll of the store
// target makes (a tollgate.Combiner) and through the reference model's, and
// requires every Result of every limit to be equal. A set is 1 to 4 limits
// drawn from four that evolve as Gen's do (rate, burst and delay changes,
// new periods), each of its own algorithm (drawn from all six, repeats
// allowed, so two token buckets of different periods meet); its clock
// moves as Gen's does, aimed at the set's RetryAfter; its cost is drawn
// up to the smallest Capacity of the set, and now and then above it (the
// store must refuse it, changing nothing). One call in five asks a single
// limit of the set by AllowN instead, on the same state, so the two calls
// are checked to share one count.
//
// Expiry is invisible here too: before a call, each of its limits' state
// that has expired is deleted or left, at random, and now and then every
// expired state is swept (see ModelTarget). Beside the model, each step
// checks what needs none: a set is admitted exactly when every Result is
// Allowed, and on the model the same set is admitted the longest
// RetryAfter later and denied one µs before.
func ModelAll(tb testing.TB, target ModelTarget, src rand.Source, steps int) {
	tb.Helper()
	rng := rand.New(src)
	var slots [allSlots]*Gen
	algs := tollgate.Algorithms()
	for i := range slots {
		slots[i] = NewGen(algs[rng.IntN(len(algs))], rand.NewPCG(rng.Uint64(), rng.Uint64()))
	}
	now := slots[0].now
	clock := NewClock()
	store := target.New(tb, clock.Now)
	comb, ok := store.(tollgate.Combiner)
	if !ok {
		tb.Fatalf("%T is no tollgate.Combiner", store)
	}
	oracle := model.New()
	ctx := context.Background()
	prefix := fmt.Sprintf("all:%d:", rand.Int64())
	trails := make(map[string]*trail)
	drops := rand.New(rand.NewPCG(rng.Uint64(), 0xa11))
	var admitted, denied, refused, singles int
	for i := 0; i < steps; i++ {
		// The set: its driver moves the clock, the others only their limits.
		pick := rng.Perm(allSlots)[:1+rng.IntN(allSlots)]
		driver := slots[pick[0]]
		driver.now = now
		c := driver.Next()
		now = c.Now
		key := prefix + fmt.Sprint(c.Key)
		limits := []tollgate.Limit{c.Limit}
		gens := []*Gen{driver}
		for _, s := range pick[1:] {
			g := slots[s]
			g.now = now
			g.moveLimit()
			if !sharesState(limits, g.limit) {
				limits, gens = append(limits, g.limit), append(gens, g)
			}
		}
		n := setCost(rng, limits)
		clock.Set(time.UnixMicro(now).Sub(T0))
		if drops.IntN(100) == 0 {
			sweep(tb, target, store, oracle, trails, now)
		}
		single := rng.IntN(5) == 0
		if single {
			// One limit alone by AllowN, on the same state as the sets'.
			j := rng.IntN(len(limits))
			limits, gens = limits[j:j+1], gens[j:j+1]
			singles++
		}

		ok := n <= minCapacity(limits)
		trs := make([]*trail, len(limits))
		for j, l := range limits {
			name := stateName(key, l)
			if trails[name] == nil {
				trails[name] = &trail{key: key}
			}
			trs[j] = trails[name]
			if ok {
				if exp, held := oracle.Expiry(key, l); held && now >= exp {
					trs[j].forget()
				}
			}
		}
		live := make([]bool, len(limits))
		if ok {
			for j, l := range limits {
				live[j] = expireBefore(tb, target, store, oracle, key, l, now, drops.IntN(2) == 0)
			}
		}
		var (
			want []tollgate.Result
			werr error
		)
		if single {
			var w tollgate.Result
			w, werr = oracle.AllowN(key, limits[0], n, now)
			want = []tollgate.Result{w}
		} else {
			want, werr = oracle.AllowAll(key, limits, n, now)
		}
		all := werr == nil && allAllowed(want)
		befores := make([]any, len(limits))
		if werr == nil && target.Before != nil {
			for j, l := range limits {
				if !(all && n > 0) {
					befores[j] = target.Before(tb, store, key, l)
				}
			}
		}
		var (
			got  []tollgate.Result
			gerr error
		)
		if single {
			var r tollgate.Result
			r, gerr = store.AllowN(ctx, key, limits[0], n)
			got = []tollgate.Result{r}
		} else {
			got, gerr = comb.AllowAll(ctx, key, limits, n, nil)
		}
		switch {
		case werr != nil:
			if !errCost(gerr) {
				tb.Fatalf("step %d: the model refuses cost %d under %v (%v), the store says %v, %v", i, n, limits, werr, got, gerr)
			}
			refused++
			continue
		case gerr != nil:
			tb.Fatalf("step %d: %v under %v: %v\n%s", i, n, limits, gerr, trailsOf(trs))
		case len(got) != len(limits):
			tb.Fatalf("step %d: %d Results for %d limits", i, len(got), len(limits))
		}
		for j, l := range limits {
			// What each limit was asked: n, or a look when it would have
			// admitted in a set another limit denied.
			cj := Call{Key: c.Key, Limit: l, N: n, Now: now}
			if !all && want[j].Allowed {
				cj.N = 0
			}
			trs[j].add(cj, got[j], nil)
			if got[j] != want[j] {
				tb.Fatalf("step %d: store and model differ on limit %d of %d (cost %d):\n%s\nmodel:    %s", i, j, len(limits), n, trailsOf(trs), show(want[j]))
			}
			checkResult(tb, i, cj, got[j], trs[j])
			trs[j].admit(tb, i, cj, got[j])
		}
		if all {
			admitted++
		} else {
			denied++
			checkAllRetry(tb, i, oracle, key, limits, n, now, want, trs)
		}
		for j, l := range limits {
			wrote := all && n > 0
			if target.After != nil && target.After(tb, store, key, l, got[j], wrote, befores[j], expiryAfter(oracle, key, l, want[j], wrote, live[j])) {
				oracle.Reset(key, l)
				trails[stateName(key, l)] = &trail{key: key}
			}
			gens[j].Saw(got[j])
		}
		// The driver aims its clock at the set's instants: the longest
		// RetryAfter and Delay.
		seen := got[0]
		for _, r := range got[1:] {
			seen.RetryAfter, seen.Delay = max(seen.RetryAfter, r.RetryAfter), max(seen.Delay, r.Delay)
		}
		driver.Saw(seen)
	}
	tb.Logf("%d calls: %d admitted, %d denied, %d refused; %d of them one limit by AllowN", steps, admitted, denied, refused, singles)
}

// sharesState reports whether l would share a state with one of limits.
func sharesState(limits []tollgate.Limit, l tollgate.Limit) bool {
	for _, o := range limits {
		if o.Algorithm == l.Algorithm && o.Period == l.Period && o.Calendar == l.Calendar {
			return true
		}
	}
	return false
}

func minCapacity(limits []tollgate.Limit) int {
	c := limits[0].Capacity()
	for _, l := range limits[1:] {
		c = min(c, l.Capacity())
	}
	return c
}

// setCost draws a cost for limits: mostly one the smallest of them can
// admit, now and then one above it.
func setCost(rng *rand.Rand, limits []tollgate.Limit) int {
	c := minCapacity(limits)
	switch r := rng.IntN(100); {
	case r < 10:
		return 0
	case r < 50:
		return 1
	case r < 80:
		return rng.IntN(c + 1)
	case r < 88:
		return c
	case r < 97:
		return min(c, 2+rng.IntN(20))
	default:
		return c + 1 + rng.IntN(3)
	}
}

func allAllowed(rs []tollgate.Result) bool {
	for _, r := range rs {
		if !r.Allowed {
			return false
		}
	}
	return true
}

// checkAllRetry asks copies of the model, as it is after a denied set, for
// the same set the longest RetryAfter later (admitted) and one µs before
// (denied).
func checkAllRetry(tb testing.TB, i int, m *model.Model, key string, limits []tollgate.Limit, n int, now int64, rs []tollgate.Result, trs []*trail) {
	tb.Helper()
	var retry time.Duration
	for _, r := range rs {
		retry = max(retry, r.RetryAfter)
	}
	us := int64(retry / time.Microsecond)
	at, err := m.Clone().AllowAll(key, limits, n, now+us)
	if err != nil || !allAllowed(at) {
		tb.Fatalf("step %d: %v n %d at %d: the longest RetryAfter is %v, but the set is then denied: %v %v\n%s", i, limits, n, now, retry, at, err, trailsOf(trs))
	}
	early, err := m.Clone().AllowAll(key, limits, n, now+us-1)
	if err != nil || allAllowed(early) {
		tb.Fatalf("step %d: %v n %d at %d: the longest RetryAfter is %v, but the set is admitted 1µs earlier: %v %v\n%s", i, limits, n, now, retry, early, err, trailsOf(trs))
	}
}

func trailsOf(trs []*trail) string {
	var b strings.Builder
	for j, tr := range trs {
		fmt.Fprintf(&b, "limit %d: %s\n", j, tr)
	}
	return b.String()
}
