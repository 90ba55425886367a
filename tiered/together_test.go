package tiered_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
)

// TestModelAll: sets of limits decided through a tiered store with the
// denial cache, mixed with single AllowN calls on the same state (which
// the cache answers), must be the model's, as the global store's are.
// State expires through the tiered store's Reset, which forgets what the
// cache remembered: the generator steps the one clock the tiers share
// back and forth, and a remembered denial is promised only while the
// global state it came from lives (see the package doc).
func TestModelAll(t *testing.T) {
	t.Parallel()
	target := conformance.ModelTarget{
		New: func(tb testing.TB, now func() time.Time) tollgate.Store {
			g := memorystore.New(memorystore.WithClock(now), memorystore.WithMaxKeys(1<<28))
			return tiered.New(g, tiered.WithClock(now), tiered.WithDenialCache(), untimed)
		},
	}
	for i := range uint64(2) {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			conformance.ModelAll(t, target, rand.NewPCG(7, 0xa11+i), 50000)
		})
	}
}

// TestAllowAllRemembers: a set's answer is remembered per limit as
// AllowN's is; an admission of a set spends every limit's state, so what
// the cache remembered before is replaced, never answered again.
func TestAllowAllRemembers(t *testing.T) {
	t.Parallel()
	for _, g := range globalStores() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := conformance.NewClock()
			global := g.new(t, clock.Now)
			s := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithDenialCache(), untimed)
			second := tollgate.Limit{Rate: 2, Period: time.Second, Burst: 2}
			minute := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: time.Minute}
			limits := []tollgate.Limit{second, minute}
			k := key(t)

			for i, want := range []bool{true, false} {
				rs, err := s.AllowAll(ctx, k, limits, 2, nil)
				if err != nil || len(rs) != 2 || rs[0].Allowed != want || !rs[1].Allowed {
					t.Fatalf("set %d of 2 = %+v, %v; want the second's limit allowed %v, the minute's allowed", i, rs, err, want)
				}
			}
			if look, err := global.AllowN(ctx, k, minute, 0); err != nil || look.Remaining != 3 {
				t.Fatalf("the minute's window after an admission and a denial of 2 = %+v, %v; want 3 left (the denial spent none)", look, err)
			}
			// The set's answer is remembered per limit as AllowN's: half a
			// second later (1 token back) a single request of 2 is denied
			// locally, as the global store would deny it…
			clock.Set(500 * time.Millisecond)
			got, err := s.AllowN(ctx, k, second, 2)
			if err != nil || got.Allowed || s.Stats().LocalDenials != 1 {
				t.Fatalf("single request of 2 = %+v, %v, %+v; want denied locally", got, err, s.Stats())
			}
			if want, err := global.AllowN(ctx, k, second, 2); err != nil || got != want {
				t.Errorf("the local denial %+v, the global store's %+v (%v)", got, want, err)
			}
			// …and after a set of 1 spends the key again, the remembered
			// RetryAfter would be too short: what is answered is the new one.
			clock.Set(600 * time.Millisecond)
			if rs, err := s.AllowAll(ctx, k, limits, 1, nil); err != nil || !rs[0].Allowed || !rs[1].Allowed {
				t.Fatalf("set of 1 = %+v, %v; want admitted", rs, err)
			}
			clock.Set(900 * time.Millisecond)
			got, err = s.AllowN(ctx, k, second, 2)
			if want, werr := global.AllowN(ctx, k, second, 2); err != nil || werr != nil || got.Allowed || got != want || want.RetryAfter != 600*time.Millisecond {
				t.Errorf("single request of 2 after the set %+v (%v), the global store's %+v (%v); want the same denial, RetryAfter 600ms", got, err, want, werr)
			}
		})
	}
}

// TestAllowAllDegraded: with Redis down, a set is decided locally at each
// limit's share, all or nothing; a limit whose share cannot admit the cost
// denies it until the breaker's cool-down ends, and spends nothing.
func TestAllowAllDegraded(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	s := tiered.New(redisstore.New(srv.Client(t)), tiered.WithInstances(2), tiered.WithBreaker(1, time.Hour), tiered.WithTimeout(200*time.Millisecond))
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	second := tollgate.Limit{Rate: 4, Period: time.Second, Burst: 4}                    // 2 a second each
	hour := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 6, Period: time.Hour} // 3 an hour each
	limits := []tollgate.Limit{second, hour}
	k := key(t)
	admitted := 0
	for range 5 {
		rs, err := s.AllowAll(ctx, k, limits, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rs[0].Limit.Rate != 2 || rs[1].Limit.Rate != 3 {
			t.Fatalf("degraded limits %v and %v, want the shares 2/s and 3/h", rs[0].Limit, rs[1].Limit)
		}
		if rs[0].Allowed && rs[1].Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("%d sets admitted with Redis down, want 2 (the second's share)", admitted)
	}
	rs, err := s.AllowAll(ctx, k, limits, 3, nil)
	if err != nil || rs[0].Allowed || rs[0].RetryAfter < 59*time.Minute || !rs[1].Allowed || rs[1].Remaining != 1 {
		t.Errorf("a cost of 3, above the second's share = %+v, %v; want it denied until the cool-down ends, the hour's share looked at (1 left)", rs, err)
	}
	if st := s.Stats(); st.Degraded != 6 || st.GlobalErrors != 1 {
		t.Errorf("stats %+v, want 6 degraded decisions and 1 global error", st)
	}
}

func TestAllowAllRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limits := []tollgate.Limit{tollgate.PerSecond(1), tollgate.PerMinute(10)}
	plain := tiered.New(struct{ tollgate.Store }{memorystore.New()})
	if _, err := plain.AllowAll(ctx, "k", limits, 1, nil); err == nil || !strings.Contains(err.Error(), "cannot decide limits together") {
		t.Errorf("over a store that is no Combiner: err = %v", err)
	}
	global := memorystore.New()
	s := tiered.New(global)
	twice := []tollgate.Limit{tollgate.PerSecond(1), tollgate.PerSecond(5)}
	if _, err := s.AllowAll(ctx, "k", twice, 1, nil); err == nil || !strings.HasPrefix(err.Error(), "tiered: ") {
		t.Errorf("two limits of one state: err = %v, want tiered: …", err)
	}
	if st := s.Stats(); st.GlobalCalls != 0 {
		t.Errorf("%d global calls for refused sets, want 0", st.GlobalCalls)
	}
}
