package tollgate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

func ExampleConcurrencyStore() {
	// At most 2 exports per tenant at once, in every replica together with
	// redisstore.New(rdb); in one process with the memory store.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a fixed clock, for the output below
	var store tollgate.ConcurrencyStore = memorystore.NewConcurrency(memorystore.WithClock(func() time.Time { return now }))
	ctx := context.Background()

	var held []tollgate.Permit
	for range 3 {
		p, res, err := store.Acquire(ctx, "export:acme", 2, 30*time.Second)
		if err != nil {
			panic(err) // invalid input or a store that failed, never "at the limit"
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", res.Allowed, res.Remaining, res.RetryAfter)
		if res.Allowed {
			held = append(held, p)
		}
	}

	// A holder that is done gives its slot back at once ...
	_ = store.Release(ctx, held[0])
	_, res, _ := store.Acquire(ctx, "export:acme", 2, 30*time.Second)
	fmt.Println("after a release:", res.Allowed)

	// ... and one that crashed gives it back when its lease ends.
	now = now.Add(30 * time.Second)
	_, err := store.Renew(ctx, held[1], 30*time.Second)
	fmt.Println("renew after the lease:", errors.Is(err, tollgate.ErrPermitExpired))
	// Output:
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=30s
	// after a release: true
	// renew after the lease: true
}

func TestCheckAcquire(t *testing.T) {
	t.Parallel()
	long := string(make([]byte, tollgate.MaxKeyLen+1))
	for _, tc := range []struct {
		name  string
		key   string
		max   int
		lease time.Duration
		want  int64 // µs
		err   error
	}{
		{"smallest", "k", 1, tollgate.MinLease, 1000, nil},
		{"largest", "k", tollgate.MaxConcurrency, tollgate.MaxLease, int64(tollgate.MaxLease / time.Microsecond), nil},
		{"lease rounded up", "k", 3, time.Second + 1, 1_000_001, nil},
		{"empty key", "", 1, time.Second, 0, tollgate.ErrInvalidKey},
		{"long key", long, 1, time.Second, 0, tollgate.ErrInvalidKey},
		{"max 0", "k", 0, time.Second, 0, tollgate.ErrInvalidLimit},
		{"max too large", "k", tollgate.MaxConcurrency + 1, time.Second, 0, tollgate.ErrInvalidLimit},
		{"lease too short", "k", 1, tollgate.MinLease - time.Microsecond, 0, tollgate.ErrInvalidLimit},
		{"lease too long", "k", 1, tollgate.MaxLease + time.Microsecond, 0, tollgate.ErrInvalidLimit},
		{"negative lease", "k", 1, -time.Second, 0, tollgate.ErrInvalidLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tollgate.CheckAcquire(tc.key, tc.max, tc.lease)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if want := tc.want; got != want {
				t.Errorf("lease = %dµs, want %d", got, want)
			}
		})
	}
}

func TestCheckPermit(t *testing.T) {
	t.Parallel()
	id := tollgate.NewPermitID()
	for _, tc := range []struct {
		name string
		p    tollgate.Permit
		ok   bool
	}{
		{"fresh", tollgate.Permit{Key: "k", ID: id}, true},
		{"zero", tollgate.Permit{}, false},
		{"no key", tollgate.Permit{ID: id}, false},
		{"short ID", tollgate.Permit{Key: "k", ID: id[1:]}, false},
		{"long ID", tollgate.Permit{Key: "k", ID: id + "0"}, false},
		{"not hex", tollgate.Permit{Key: "k", ID: "g" + id[1:]}, false},
		{"a Lua pattern", tollgate.Permit{Key: "k", ID: "%d" + id[2:]}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tollgate.CheckPermit(tc.p)
			if got, want := err == nil, tc.ok; got != want {
				t.Fatalf("err = %v, want ok %v", err, want)
			}
			if err != nil && !errors.Is(err, tollgate.ErrInvalidPermit) {
				t.Errorf("err = %v, want ErrInvalidPermit", err)
			}
		})
	}
}

func TestNewPermitIDUnique(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10_000 {
		id := tollgate.NewPermitID()
		if err := tollgate.CheckPermit(tollgate.Permit{Key: "k", ID: id}); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("%s drawn twice", id)
		}
		seen[id] = true
	}
}
