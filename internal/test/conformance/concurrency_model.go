package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// ConcurrencyModel runs a random sequence of Acquire (a third of them
// AcquireID, under names that repeat), Release and Renew on a few keys through the store b makes, with a clock that stands still, moves
// forward in small and large steps and (if b.StepsBack) back, and checks
// every answer against a deliberately simple model: per key, a list of
// (ID, expiry) from which each call on the key first drops what has lapsed.
// After every admitted Acquire the store must hold exactly the model's
// permits, never more than max.
//
// As in Differential, the clock is the real time elapsed plus the random
// steps, so a store that expires keys in real time (Redis) never drops one
// before the model does; b.Keep closes the gap that remains.
func ConcurrencyModel(t *testing.T, b ConcurrencyBackend, steps int, seed uint64) {
	clock := NewClock()
	store := b.New(t, clock.Now)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ctx := context.Background()
	prefix := fmt.Sprintf("model:conc:%d:", rand.Int64())

	type held struct {
		id  string
		exp time.Time
	}
	model := map[string][]held{}
	// drop removes key's lapsed permits at now, as every call does.
	drop := func(key string, now time.Time) []held {
		live := model[key][:0:0]
		for _, h := range model[key] {
			if h.exp.After(now) {
				live = append(live, h)
			}
		}
		model[key] = live
		return live
	}
	keep := func(key string) {
		if b.Keep != nil {
			b.Keep(t, store, key)
		}
	}
	var granted []tollgate.Permit // every permit ever granted, lapsed or not
	leases := []time.Duration{ms, 7 * ms, 100 * ms, 350 * ms, sec, 3 * sec}
	var virtual time.Duration
	var admitted, denied, lapsed int // how much of the ground was covered
	begin := time.Now()
	for i := 0; i < steps; i++ {
		switch r := rng.IntN(100); {
		case r < 45:
		case r < 85:
			virtual += time.Duration(rng.IntN(200_000)) * us
		case r < 95 || !b.StepsBack:
			virtual += time.Duration(rng.IntN(4000)) * ms
		default:
			virtual -= time.Duration(rng.IntN(2000)) * ms
		}
		clock.Set(virtual + time.Since(begin).Truncate(us))
		now := clock.Now()
		key := prefix + fmt.Sprint(rng.IntN(3))
		lease := leases[rng.IntN(len(leases))]
		switch r := rng.IntN(100); {
		case r < 50 || len(granted) == 0:
			max := 1 + rng.IntN(4)
			var (
				p   tollgate.Permit
				got tollgate.ConcurrencyResult
				err error
				id  string // a named permit's ID, from a small pool so that names repeat
			)
			if rng.IntN(3) == 0 {
				id = tollgate.PermitID(fmt.Sprint("request-", rng.IntN(6)))
				p, got, err = store.AcquireID(ctx, key, id, max, lease)
			} else {
				p, got, err = store.Acquire(ctx, key, max, lease)
			}
			if err != nil {
				t.Fatalf("step %d: Acquire: %v", i, err)
			}
			keep(key)
			live := drop(key, now)
			want := tollgate.ConcurrencyResult{Max: max}
			if k := slices.IndexFunc(live, func(h held) bool { return id != "" && h.id == id }); k >= 0 {
				// The name is held: denied until that permit lapses.
				want.RetryAfter = live[k].exp.Sub(now)
			} else if len(live) < max {
				want.Allowed, want.Remaining = true, max-len(live)-1
			} else {
				exps := make([]time.Time, len(live))
				for k, h := range live {
					exps[k] = h.exp
				}
				slices.SortFunc(exps, time.Time.Compare)
				want.RetryAfter = exps[len(live)-max].Sub(now)
			}
			if got != want {
				t.Fatalf("step %d: Acquire(%s, max %d, lease %v) at %v with %d live:\n got %+v\nwant %+v", i, key, max, lease, now.Sub(T0), len(live), got, want)
			}
			if !got.Allowed {
				denied++
			} else {
				admitted++
				if !p.Expires.Equal(now.Add(lease)) || id != "" && p.ID != id {
					t.Fatalf("step %d: permit %+v, want one expiring at %v (ID %q if named)", i, p, now.Add(lease), id)
				}
				model[key] = append(live, held{p.ID, p.Expires})
				granted = append(granted, p)
				// The invariant itself, counted in the store: what it
				// holds, lapsed permits included, never exceeds max. A
				// store whose keys expire in real time may already have
				// dropped some that the test's clock, standing still
				// since the call, still counts.
				n, _ := b.Held(t, store, key, now)
				if n > len(model[key]) || n > max || b.StepsBack && n != len(model[key]) {
					t.Fatalf("step %d: store holds %d permits on %s, model %d, max %d", i, n, key, len(model[key]), max)
				}
			}
		case r < 75:
			p := granted[rng.IntN(len(granted))]
			if err := store.Release(ctx, p); err != nil {
				t.Fatalf("step %d: Release: %v", i, err)
			}
			keep(p.Key)
			live := drop(p.Key, now)
			model[p.Key] = slices.DeleteFunc(live, func(h held) bool { return h.id == p.ID })
		default:
			p := granted[rng.IntN(len(granted))]
			got, err := store.Renew(ctx, p, lease)
			keep(p.Key)
			live := drop(p.Key, now)
			k := slices.IndexFunc(live, func(h held) bool { return h.id == p.ID })
			if k < 0 {
				lapsed++
				if !errors.Is(err, tollgate.ErrPermitExpired) {
					t.Fatalf("step %d: Renew of a lapsed permit: %+v, %v; want ErrPermitExpired", i, got, err)
				}
				continue
			}
			if err != nil || !got.Expires.Equal(now.Add(lease)) {
				t.Fatalf("step %d: Renew: %+v, %v; want expiry %v", i, got, err, now.Add(lease))
			}
			live[k].exp = got.Expires
		}
	}
	t.Logf("%d steps: %d admitted, %d denied, %d renewals of lapsed permits", steps, admitted, denied, lapsed)
	if admitted == 0 || denied == 0 || lapsed == 0 {
		t.Errorf("the random steps missed a case: %d admitted, %d denied, %d lapsed renewals", admitted, denied, lapsed)
	}
}
