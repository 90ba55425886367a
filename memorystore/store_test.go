package memorystore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/conformance"
	"github.com/tollgate/tollgate/memorystore"
)

func backend() conformance.Backend {
	return conformance.Backend{
		New: func(t *testing.T, now func() time.Time) tollgate.Store {
			return memorystore.New(memorystore.WithClock(now))
		},
		TTL: func(t *testing.T, s tollgate.Store, key string, limit tollgate.Limit) (time.Duration, bool) {
			return s.(*memorystore.Store).TTL(key, limit)
		},
		TTLGrain: time.Millisecond, // as Redis's
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, backend())
}

func TestEquivalences(t *testing.T) {
	conformance.Equivalences(t, backend(), 5000, 1)
}

func TestMaxKeysBoundsMemory(t *testing.T) {
	t.Parallel()
	clock := conformance.NewClock()
	s := memorystore.New(memorystore.WithClock(clock.Now), memorystore.WithMaxKeys(1000), memorystore.WithShards(8))
	ctx := context.Background()
	limit := tollgate.PerMinute(10)
	for i := 0; i < 10_000; i++ {
		if _, err := s.AllowN(ctx, fmt.Sprint("k", i), limit, 1); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if got, max := st.Keys, 1000; got > max {
		t.Errorf("Keys = %d, want at most %d", got, max)
	}
	if st.Evictions == 0 {
		t.Errorf("Evictions = 0, want the live keys that did not fit counted")
	}
}

func TestExpiredKeysAreReclaimed(t *testing.T) {
	t.Parallel()
	clock := conformance.NewClock()
	s := memorystore.New(memorystore.WithClock(clock.Now), memorystore.WithMaxKeys(1000), memorystore.WithShards(8))
	ctx := context.Background()
	limit := tollgate.PerSecond(10) // a key is back to full 100ms after one request
	for round := 0; round < 20; round++ {
		clock.Set(time.Duration(round) * time.Second)
		for i := 0; i < 500; i++ {
			if _, err := s.AllowN(ctx, fmt.Sprint("r", round, "k", i), limit, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := s.Stats()
	if st.Keys > 1000 {
		t.Errorf("Keys = %d, want at most 1000", st.Keys)
	}
	// Only 500 keys are live at a time, so reclaiming expired keys must
	// have made room without evicting a live one.
	if st.Evictions != 0 {
		t.Errorf("Evictions = %d, want 0: expired keys should make room first", st.Evictions)
	}
}

func TestPeekStoresNothing(t *testing.T) {
	t.Parallel()
	s := memorystore.New()
	if _, err := s.AllowN(context.Background(), "k", tollgate.PerSecond(1), 0); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Keys; got != 0 {
		t.Errorf("Keys = %d after a look at a fresh key, want 0", got)
	}
}

func TestCanceledContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := memorystore.New().AllowN(ctx, "k", tollgate.PerSecond(1), 1); err == nil {
		t.Error("AllowN with a canceled context: err = nil, want the context's error")
	}
}

func TestChanges(t *testing.T) {
	t.Parallel()
	conformance.Changes(t, backend(), 5000, 7)
}
