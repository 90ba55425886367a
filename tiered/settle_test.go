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

// A refund makes room that a remembered denial does not know of: the
// settle must make the local tier forget it.
func TestSettleForgetsDenial(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := conformance.NewClock()
	s := tiered.New(memorystore.New(memorystore.WithClock(clock.Now)), tiered.WithClock(clock.Now), untimed)
	limit := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: time.Minute, Burst: 5}
	k := key(t)

	res, at, err := s.ReserveN(ctx, k, limit, 5)
	if err != nil || !res.Allowed {
		t.Fatalf("reserve 5 of 5 = %+v, %v; want allowed", res, err)
	}
	for i, want := range []bool{false, false} {
		if got, err := s.AllowN(ctx, k, limit, 1); err != nil || got.Allowed != want {
			t.Fatalf("request %d after the reservation: allowed %v, %v; want %v", i, got.Allowed, err, want)
		}
	}
	if got, want := s.Stats().LocalDenials, uint64(2); got != want {
		t.Fatalf("local denials = %d, want %d: the reservation left nothing, which the local tier knows", got, want)
	}
	if _, err := s.SettleN(ctx, k, limit, at, 5, 0); err != nil {
		t.Fatal(err)
	}
	got, err := s.AllowN(ctx, k, limit, 1)
	if err != nil || !got.Allowed || got.Remaining != 4 {
		t.Errorf("after the refund = %+v, %v; want allowed with 4 remaining", got, err)
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
