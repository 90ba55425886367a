package memorystore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
)

// The Result of every settle is checked against hand-worked values by
// conformance.RunSettle (TestConformance) and against the model by
// TestSettleModel; these check what the store keeps.

func TestSettleKeepsState(t *testing.T) {
	t.Parallel()
	bucket := tollgate.Limit{Rate: 2, Period: time.Second, Burst: 5}
	window := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: 10 * time.Second}
	at := conformance.T0.UnixMicro()
	for _, tc := range []struct {
		name             string
		limit            tollgate.Limit
		reserve          int // first, at T0; 0: none
		reserved, actual int // then settled at T0
		wantKeys         int
		wantTTL          time.Duration // at most 0: held, and expired
	}{
		{"a charge keeps the key until it is full", bucket, 5, 5, 8, 1, 4 * time.Second},
		{"a refund to full leaves it expired", bucket, 2, 2, 0, 1, 0},
		{"a charge on a fresh key starts it", bucket, 0, 1, 3, 1, time.Second},
		{"a refund on a fresh key stores nothing", bucket, 0, 3, 0, 0, 0},
		{"a window charge keeps it to the window's end", window, 1, 1, 4, 1, 10 * time.Second},
		{"a window refund on a fresh key stores nothing", window, 0, 1, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := conformance.NewClock()
			s := memorystore.New(memorystore.WithClock(clock.Now))
			ctx := context.Background()
			if tc.reserve > 0 {
				if _, _, err := s.ReserveN(ctx, "k", tc.limit, tc.reserve); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.SettleN(ctx, "k", tc.limit, at, tc.reserved, tc.actual); err != nil {
				t.Fatal(err)
			}
			if got, want := s.Stats().Keys, tc.wantKeys; got != want {
				t.Errorf("Keys = %d, want %d", got, want)
			}
			if got, ok := s.TTL("k", tc.limit); tc.wantKeys > 0 && (!ok || tc.wantTTL > 0 && got != tc.wantTTL || tc.wantTTL <= 0 && got > 0) {
				t.Errorf("TTL = %v (held %v), want %v", got, ok, tc.wantTTL)
			}
		})
	}
}

// A key expired before the settle: a refund forgets it, as a look does, and
// a clock that then steps back does not find it again.
func TestSettleForgetsAnExpiredKey(t *testing.T) {
	t.Parallel()
	clock := conformance.NewClock()
	s := memorystore.New(memorystore.WithClock(clock.Now))
	ctx := context.Background()
	limit := tollgate.Limit{Rate: 2, Period: time.Second, Burst: 5}
	_, at, err := s.ReserveN(ctx, "k", limit, 5)
	if err != nil {
		t.Fatal(err)
	}
	clock.Set(time.Minute)
	if _, err := s.SettleN(ctx, "k", limit, at, 5, 0); err != nil {
		t.Fatal(err)
	}
	clock.Set(time.Second)
	r, err := s.AllowN(ctx, "k", limit, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Remaining, 5; got != want {
		t.Errorf("Remaining = %d, want %d: the expired state came back", got, want)
	}
}

// ReserveN shares AllowN's path, and neither it nor SettleN allocates on a
// key that exists.
func TestSettleAllocatesNothing(t *testing.T) {
	s := memorystore.New()
	ctx := context.Background()
	for _, a := range tollgate.Algorithms() {
		limit := tollgate.Limit{Algorithm: a, Rate: 100, Period: time.Hour, Burst: 100}
		key := fmt.Sprint("k", a)
		if _, err := s.AllowN(ctx, key, limit, 1); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			_, at, err := s.ReserveN(ctx, key, limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.SettleN(ctx, key, limit, at, 1, 0); err != nil {
				t.Fatal(err)
			}
		})
		if got, want := allocs, 0.0; got != want {
			t.Errorf("%s: %v allocations per reservation and settle, want %v", a, got, want)
		}
	}
}
