package tiered_test

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/tiered"
)

// A client far over its limit: after the global store's first denial, the
// local tier answers the rest, each with the RetryAfter the global store
// would give. (In production the global store is a redisstore.Store; a
// memorystore stands in for it here, on a fixed clock.)
func ExampleNew() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	global := memorystore.New(memorystore.WithClock(clock))
	s := tiered.New(global, tiered.WithClock(clock), tiered.WithDenialCache(), tiered.WithInstances(4))
	lim := tollgate.New(s)
	limit := tollgate.PerSecond(2)
	for i := 0; i < 5; i++ {
		res, _ := lim.Allow(context.Background(), "user:42", limit)
		fmt.Println(res.Allowed, res.Remaining, res.RetryAfter)
		now = now.Add(100 * time.Millisecond)
	}
	st := s.Stats()
	fmt.Println("global calls:", st.GlobalCalls, "answered locally:", st.LocalDenials)
	// Output:
	// true 1 0s
	// true 0 0s
	// false 0 300ms
	// false 0 200ms
	// false 0 100ms
	// global calls: 2 answered locally: 3
}
