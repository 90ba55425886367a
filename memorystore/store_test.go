package memorystore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
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
		Settles:  true,
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

// TestTableKeepsEveryKey: keys come and go at random in one shard, whose
// table wraps around and moves entries back on every removal; after each
// step the shard holds as many keys as it should, and every so often each
// key is checked to hold the state it was given. Few keys keep the table
// small, so that clusters of entries often wrap around its end.
func TestTableKeepsEveryKey(t *testing.T) {
	t.Parallel()
	// A sliding window log's entries live beside the table and are reused
	// by the keys that come after, so it is checked too.
	logs := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: tollgate.MaxLogRate, Period: time.Hour}
	for _, limit := range []tollgate.Limit{tollgate.PerHour(tollgate.MaxLogRate), logs} {
		for _, nkeys := range []int{3, 7, 20, 300} {
			t.Run(fmt.Sprint(limit.Algorithm, " ", nkeys, " keys"), func(t *testing.T) {
				t.Parallel()
				tableKeepsEveryKey(t, limit, nkeys, func(i int) string { return fmt.Sprint("k", i) })
			})
		}
	}
}

// TestTableKeepsKeysOfEveryLength: keys of 2 to 41 bytes, some kept in
// their entry and some apart from it, that differ in one byte only, each
// keep a state of their own as keys come and go.
func TestTableKeepsKeysOfEveryLength(t *testing.T) {
	t.Parallel()
	for _, nkeys := range []int{20, 300} {
		t.Run(fmt.Sprint(nkeys, " keys"), func(t *testing.T) {
			t.Parallel()
			tableKeepsEveryKey(t, tollgate.PerHour(tollgate.MaxLogRate), nkeys, func(i int) string {
				return fmt.Sprintf("%0*d", 2+i%40, i)
			})
		})
	}
}

func tableKeepsEveryKey(t *testing.T, limit tollgate.Limit, nkeys int, name func(int) string) {
	clock := conformance.NewClock()
	s := memorystore.New(memorystore.WithClock(clock.Now), memorystore.WithShards(1), memorystore.WithMaxKeys(1<<20))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, uint64(nkeys)))
	want := map[string]int{} // key → tokens spent
	for step := range 20_000 {
		key := name(rng.IntN(nkeys))
		if rng.IntN(3) == 0 {
			if err := s.Reset(ctx, key, limit); err != nil {
				t.Fatal(err)
			}
			delete(want, key)
		} else {
			if _, err := s.AllowN(ctx, key, limit, 1); err != nil {
				t.Fatal(err)
			}
			want[key]++
		}
		if got, want := s.Stats().Keys, len(want); got != want {
			t.Fatalf("step %d: Keys = %d, want %d", step, got, want)
		}
		if step%(1+nkeys/8) != 0 {
			continue
		}
		for i := range nkeys {
			k := name(i)
			r, err := s.AllowN(ctx, k, limit, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := r.Remaining, tollgate.MaxLogRate-want[k]; got != want {
				t.Fatalf("step %d: %s has %d remaining, want %d", step, k, got, want)
			}
		}
	}
}

// TestBlockTablesKeepEveryKey: a store large enough that its shards'
// tables are cut from blocks (see table) keeps every key's state as the
// shards move from their own tables into a block and from one block into
// the next, twice as large.
func TestBlockTablesKeepEveryKey(t *testing.T) {
	t.Parallel()
	// Two shards: their tables come from a block from 65,536 entries
	// each on (8 MiB), which they reach past 16,384 keys each.
	const nkeys = 80_000
	clock := conformance.NewClock()
	s := memorystore.New(memorystore.WithClock(clock.Now), memorystore.WithShards(2))
	ctx := context.Background()
	limit := tollgate.Limit{Rate: 100, Period: time.Hour, Burst: 10}
	spent := func(i int) int { return 1 + i%3 }
	for i := range nkeys {
		if _, err := s.AllowN(ctx, fmt.Sprint("k", i), limit, spent(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := s.Stats().Keys, nkeys; got != want {
		t.Fatalf("Keys = %d, want %d", got, want)
	}
	for i := range nkeys {
		r, err := s.AllowN(ctx, fmt.Sprint("k", i), limit, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := r.Remaining, limit.Burst-spent(i); got != want {
			t.Fatalf("k%d has %d remaining, want %d", i, got, want)
		}
	}
}

// TestBlockMoveWhileDeciding: goroutines add keys at once while the
// shards move into blocks (one goroutine moves every shard, locking each
// in turn, as the others decide); afterwards every key holds what it
// spent.
func TestBlockMoveWhileDeciding(t *testing.T) {
	t.Parallel()
	// 16 shards: blocks from 8,192 entries a shard, which half of them
	// need past about 32,000 keys.
	const (
		goroutines = 4
		perG       = 12_000
	)
	s := memorystore.New(memorystore.WithShards(16))
	ctx := context.Background()
	limit := tollgate.Limit{Rate: 100, Period: time.Hour, Burst: 10}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				if _, err := s.AllowN(ctx, fmt.Sprint("g", g, ":", i), limit, 1+i%3); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got, want := s.Stats().Keys, goroutines*perG; got != want {
		t.Fatalf("Keys = %d, want %d", got, want)
	}
	for g := range goroutines {
		for i := range perG {
			r, err := s.AllowN(ctx, fmt.Sprint("g", g, ":", i), limit, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := r.Remaining, limit.Burst-(1+i%3); got != want {
				t.Fatalf("g%d:%d has %d remaining, want %d", g, i, got, want)
			}
		}
	}
}

// TestBlockTablesDifferential: a store of two shards, whose tables move
// into blocks and from block to block as keys arrive, decides exactly as a
// store of 4,096 shards, whose tables stay small and its own, over random
// decisions, reservations and settles of every algorithm on 60,000 keys,
// with the clock moving forwards and, now and then, back.
func TestBlockTablesDifferential(t *testing.T) {
	t.Parallel()
	clock := conformance.NewClock()
	blocks := memorystore.New(memorystore.WithClock(clock.Now), memorystore.WithShards(2))
	small := memorystore.New(memorystore.WithClock(clock.Now), memorystore.WithShards(4096))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(13, 17))
	var limits []tollgate.Limit
	for _, a := range tollgate.Algorithms() {
		limits = append(limits,
			tollgate.Limit{Algorithm: a, Rate: 5, Period: time.Second, Burst: 8},
			tollgate.Limit{Algorithm: a, Rate: 100, Period: time.Minute, Burst: 20})
	}
	type reservation struct {
		key      string
		limit    tollgate.Limit
		at       int64
		reserved int
	}
	var open []reservation
	var since time.Duration // the clock, from its base
	const nkeys, steps = 60_000, 300_000
	for step := range steps {
		switch r := rng.IntN(100); {
		case r < 2:
			since -= time.Duration(rng.IntN(500)) * time.Millisecond
		case r < 30:
			since += time.Duration(rng.IntN(20_000)) * time.Microsecond
		}
		clock.Set(since)
		key := fmt.Sprint("k", rng.IntN(nkeys))
		limit := limits[rng.IntN(len(limits))]
		n := rng.IntN(4)
		if len(open) > 0 && rng.IntN(10) == 0 {
			i := rng.IntN(len(open))
			o := open[i]
			open[i] = open[len(open)-1]
			open = open[:len(open)-1]
			actual := rng.IntN(2*o.reserved + 2)
			got, gerr := blocks.SettleN(ctx, o.key, o.limit, o.at, o.reserved, actual)
			want, werr := small.SettleN(ctx, o.key, o.limit, o.at, o.reserved, actual)
			if got != want || (gerr == nil) != (werr == nil) {
				t.Fatalf("step %d: settle %s %v %d→%d: %+v, %v; want %+v, %v", step, o.key, o.limit, o.reserved, actual, got, gerr, want, werr)
			}
			continue
		}
		got, at, gerr := blocks.ReserveN(ctx, key, limit, n)
		want, wat, werr := small.ReserveN(ctx, key, limit, n)
		if got != want || at != wat || (gerr == nil) != (werr == nil) {
			t.Fatalf("step %d: %s %v n=%d: %+v at %d, %v; want %+v at %d, %v", step, key, limit, n, got, at, gerr, want, wat, werr)
		}
		if gerr == nil && got.Allowed && n > 0 && rng.IntN(4) == 0 {
			open = append(open, reservation{key, limit, at, n})
		}
	}
	if got, want := blocks.Stats().Keys, small.Stats().Keys; got != want {
		t.Fatalf("Keys = %d, want %d", got, want)
	}
	t.Logf("%d keys in the end", blocks.Stats().Keys)
}
