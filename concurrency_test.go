package tollgate_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

func ExampleConcurrencyStore() {
	// At most 2 exports per tenant at once, in every replica together with
	// redisstore.New(rdb); in one process with the memory store.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a fixed clock, for the output below
	var store tollgate.ConcurrencyStore = memorystore.New(memorystore.WithClock(func() time.Time { return now }))
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
