package tiered_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/tiered"
)

// TestDenialCacheRefusesRefunds: a store with the denial cache refuses
// refunds, which the other instances' caches would not see, and changes
// nothing; charges go through, and the store that made one forgets its own
// remembered denial, whose RetryAfter is now too short.
func TestDenialCacheRefusesRefunds(t *testing.T) {
	t.Parallel()
	for _, g := range globalStores() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := conformance.NewClock()
			global := g.new(t, clock.Now)
			a := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithDenialCache(), untimed)
			b := tiered.New(global, tiered.WithClock(clock.Now), tiered.WithDenialCache(), untimed)
			limit := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Minute, Burst: 10}
			k := key(t)

			_, at, err := b.ReserveN(ctx, k, limit, 10)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if res, err := a.AllowN(ctx, k, limit, 1); err != nil || res.Allowed {
					t.Fatalf("A asks for 1 after the reservation = %+v, %v; want denied", res, err)
				}
			}
			if got, want := a.Stats().LocalDenials, uint64(1); got != want {
				t.Fatalf("A answered %d denials locally, want %d", got, want)
			}
			clock.Set(time.Second)
			before, err := global.AllowN(ctx, k, limit, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.SettleN(ctx, k, limit, at, 10, 0)
			if err == nil || !strings.HasPrefix(err.Error(), "tiered: ") || !strings.Contains(err.Error(), "refund of 10") {
				t.Fatalf("B refunds 10: err = %v, want tiered: … refund of 10 …", err)
			}
			if after, err := global.AllowN(ctx, k, limit, 0); err != nil || after != before {
				t.Fatalf("the global store after the refused refund = %+v, %v; want %+v, unchanged", after, err, before)
			}
			got, err := a.AllowN(ctx, k, limit, 1)
			if err != nil || got.Allowed || a.Stats().LocalDenials != 2 {
				t.Fatalf("A asks for 1 after the refused refund = %+v, %v; want denied locally", got, err)
			}
			if want, err := global.AllowN(ctx, k, limit, 1); err != nil || got != want {
				t.Errorf("A's local denial %+v, the global store's %+v (%v)", got, want, err)
			}

			// A charge (and a settle at the reserved cost) goes through.
			if _, err := b.SettleN(ctx, k, limit, at, 10, 10); err != nil {
				t.Fatalf("settle at the reserved cost: %v", err)
			}
			if res, err := b.SettleN(ctx, k, limit, at, 10, 12); err != nil || res.Remaining != 0 {
				t.Fatalf("charge 2 more = %+v, %v", res, err)
			}
			calls := b.Stats().GlobalCalls
			got, err = b.AllowN(ctx, k, limit, 1)
			if err != nil || b.Stats().GlobalCalls != calls+1 {
				t.Fatalf("B asks for 1 after its charge = %+v, %v; want it asked of the global store", got, err)
			}
			if want, err := global.AllowN(ctx, k, limit, 1); err != nil || got != want {
				t.Errorf("B's answer after the charge %+v, the global store's %+v (%v)", got, want, err)
			}
		})
	}
}

// TestRefundOnAnotherInstance: two instances share a global store; B
// reserves a key's whole bucket, A is denied, then B refunds it all. A's
// next request must be decided as the global store decides it: admitted,
// not denied from what A remembered before the refund.
func TestRefundOnAnotherInstance(t *testing.T) {
	t.Parallel()
	for _, g := range globalStores() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := conformance.NewClock()
			global := g.new(t, clock.Now)
			a := tiered.New(global, tiered.WithClock(clock.Now), untimed)
			b := tiered.New(global, tiered.WithClock(clock.Now), untimed)
			limit := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Minute, Burst: 10}
			k := key(t)

			res, at, err := b.ReserveN(ctx, k, limit, 10)
			if err != nil || !res.Allowed {
				t.Fatalf("B reserves 10 of 10 = %+v, %v; want allowed", res, err)
			}
			if res, err := a.AllowN(ctx, k, limit, 1); err != nil || res.Allowed {
				t.Fatalf("A asks for 1 after the reservation = %+v, %v; want denied", res, err)
			}
			clock.Set(time.Second)
			if res, err := b.SettleN(ctx, k, limit, at, 10, 0); err != nil || res.Remaining != 10 {
				t.Fatalf("B refunds 10 = %+v, %v; want 10 remaining", res, err)
			}
			got, err := a.AllowN(ctx, k, limit, 1)
			if err != nil || !got.Allowed || got.Remaining != 9 {
				t.Errorf("A asks for 1 after B's refund = %+v, %v; want allowed with 9 remaining, as the global store decides", got, err)
			}
			if look, err := global.AllowN(ctx, k, limit, 0); err != nil || look.Remaining != 9 {
				t.Errorf("the global store after A's request = %+v, %v; want 9 remaining (A's request spent there)", look, err)
			}
		})
	}
}

func TestSettleNeedsSettlingGlobal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	global := struct{ tollgate.Store }{memorystore.New()} // a Store, not a Settler
	s := tiered.New(global, untimed)
	limit := tollgate.PerMinute(5)
	for name, call := range map[string]func() error{
		"reserve": func() error { _, _, err := s.ReserveN(ctx, "k", limit, 1); return err },
		"settle":  func() error { _, err := s.SettleN(ctx, "k", limit, 0, 1, 0); return err },
	} {
		err := call()
		if err == nil || !strings.Contains(err.Error(), "cannot settle") || !strings.HasPrefix(err.Error(), "tiered: ") {
			t.Errorf("%s over a store that cannot settle: err = %v, want tiered: … cannot settle", name, err)
		}
	}
	if got := s.Stats().GlobalCalls; got != 0 {
		t.Errorf("global calls = %d, want 0", got)
	}
}
