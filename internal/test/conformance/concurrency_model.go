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
	m := &concModel{t: t, b: b, store: b.New(t, clock.Now), keys: map[string][]heldPermit{}}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ctx := context.Background()
	prefix := fmt.Sprintf("model:conc:%d:", rand.Int64())
	leases := []time.Duration{ms, 7 * ms, 100 * ms, 350 * ms, sec, 3 * sec}
	var virtual time.Duration
	begin := time.Now()
	for i := 0; i < steps; i++ {
		virtual = concClockStep(rng, virtual, b.StepsBack)
		clock.Set(virtual + time.Since(begin).Truncate(us))
		now := clock.Now()
		key := prefix + fmt.Sprint(rng.IntN(3))
		lease := leases[rng.IntN(len(leases))]
		switch r := rng.IntN(100); {
		case r < 50 || len(m.granted) == 0:
			m.acquire(ctx, rng, i, key, lease, now)
		case r < 75:
			m.release(ctx, rng, i, now)
		default:
			m.renew(ctx, rng, i, lease, now)
		}
	}
	t.Logf("%d steps: %d admitted, %d denied, %d renewals of lapsed permits", steps, m.admitted, m.denied, m.lapsed)
	if m.admitted == 0 || m.denied == 0 || m.lapsed == 0 {
		t.Errorf("the random steps missed a case: %d admitted, %d denied, %d lapsed renewals", m.admitted, m.denied, m.lapsed)
	}
}

// concClockStep moves the virtual part of ConcurrencyModel's clock: not at
// all, a little, a lot or, when back is true, backwards.
func concClockStep(rng *rand.Rand, virtual time.Duration, back bool) time.Duration {
	switch r := rng.IntN(100); {
	case r < 45:
	case r < 85:
		virtual += time.Duration(rng.IntN(200_000)) * us
	case r < 95 || !back:
		virtual += time.Duration(rng.IntN(4000)) * ms
	default:
		virtual -= time.Duration(rng.IntN(2000)) * ms
	}
	return virtual
}

// heldPermit is a permit as ConcurrencyModel's model holds it.
type heldPermit struct {
	id  string
	exp time.Time
}

// concModel is the store under ConcurrencyModel and the model it is checked
// against, with what the run has covered.
type concModel struct {
	t     *testing.T
	b     ConcurrencyBackend
	store tollgate.ConcurrencyStore
	keys  map[string][]heldPermit // the model: each key's permits
	// granted is every permit ever granted, lapsed or not.
	granted []tollgate.Permit
	// How much of the ground was covered.
	admitted, denied, lapsed int
}

// drop removes key's lapsed permits at now, as every call does.
func (m *concModel) drop(key string, now time.Time) []heldPermit {
	live := m.keys[key][:0:0]
	for _, h := range m.keys[key] {
		if h.exp.After(now) {
			live = append(live, h)
		}
	}
	m.keys[key] = live
	return live
}

// keep calls b.Keep on key, if there is one.
func (m *concModel) keep(key string) {
	if m.b.Keep != nil {
		m.b.Keep(m.t, m.store, key)
	}
}

// acquire checks an Acquire, or an AcquireID, on key at step i.
func (m *concModel) acquire(ctx context.Context, rng *rand.Rand, i int, key string, lease time.Duration, now time.Time) {
	t := m.t
	max := 1 + rng.IntN(4)
	var (
		p   tollgate.Permit
		got tollgate.ConcurrencyResult
		err error
		id  string // a named permit's ID, from a small pool so that names repeat
	)
	if rng.IntN(3) == 0 {
		id = tollgate.PermitID(fmt.Sprint("request-", rng.IntN(6)))
		p, got, err = m.store.AcquireID(ctx, key, id, max, lease)
	} else {
		p, got, err = m.store.Acquire(ctx, key, max, lease)
	}
	if err != nil {
		t.Fatalf("step %d: Acquire: %v", i, err)
	}
	m.keep(key)
	live := m.drop(key, now)
	want := wantAcquire(live, id, max, now)
	if got != want {
		t.Fatalf("step %d: Acquire(%s, max %d, lease %v) at %v with %d live:\n got %+v\nwant %+v", i, key, max, lease, now.Sub(T0), len(live), got, want)
	}
	if !got.Allowed {
		m.denied++
		return
	}
	m.admitted++
	if !p.Expires.Equal(now.Add(lease)) || id != "" && p.ID != id {
		t.Fatalf("step %d: permit %+v, want one expiring at %v (ID %q if named)", i, p, now.Add(lease), id)
	}
	m.keys[key] = append(live, heldPermit{p.ID, p.Expires})
	m.granted = append(m.granted, p)
	// The invariant itself, counted in the store: what it holds, lapsed
	// permits included, never exceeds max. A store whose keys expire in
	// real time may already have dropped some that the test's clock,
	// standing still since the call, still counts.
	n, _ := m.b.Held(t, m.store, key, now)
	if n > len(m.keys[key]) || n > max || m.b.StepsBack && n != len(m.keys[key]) {
		t.Fatalf("step %d: store holds %d permits on %s, model %d, max %d", i, n, key, len(m.keys[key]), max)
	}
}

// wantAcquire is the model's answer to an Acquire of up to max permits
// (an AcquireID when id is not empty) on a key holding live at now.
func wantAcquire(live []heldPermit, id string, max int, now time.Time) tollgate.ConcurrencyResult {
	want := tollgate.ConcurrencyResult{Max: max}
	if k := slices.IndexFunc(live, func(h heldPermit) bool { return id != "" && h.id == id }); k >= 0 {
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
	return want
}

// release checks the Release of a permit granted before step i.
func (m *concModel) release(ctx context.Context, rng *rand.Rand, i int, now time.Time) {
	p := m.granted[rng.IntN(len(m.granted))]
	if err := m.store.Release(ctx, p); err != nil {
		m.t.Fatalf("step %d: Release: %v", i, err)
	}
	m.keep(p.Key)
	live := m.drop(p.Key, now)
	m.keys[p.Key] = slices.DeleteFunc(live, func(h heldPermit) bool { return h.id == p.ID })
}

// renew checks the Renew of a permit granted before step i, live or
// lapsed.
func (m *concModel) renew(ctx context.Context, rng *rand.Rand, i int, lease time.Duration, now time.Time) {
	p := m.granted[rng.IntN(len(m.granted))]
	got, err := m.store.Renew(ctx, p, lease)
	m.keep(p.Key)
	live := m.drop(p.Key, now)
	k := slices.IndexFunc(live, func(h heldPermit) bool { return h.id == p.ID })
	if k < 0 {
		m.lapsed++
		if !errors.Is(err, tollgate.ErrPermitExpired) {
			m.t.Fatalf("step %d: Renew of a lapsed permit: %+v, %v; want ErrPermitExpired", i, got, err)
		}
		return
	}
	if err != nil || !got.Expires.Equal(now.Add(lease)) {
		m.t.Fatalf("step %d: Renew: %+v, %v; want expiry %v", i, got, err, now.Add(lease))
	}
	live[k].exp = got.Expires
}
