package testkit

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// Store is a store a test runs one scenario on, at every store: memory and
// Redis decide alike, and a scenario that passes on one must pass on the
// other.
type Store struct {
	// Name names the store in subtest names: "memory" or "redis".
	Name string
	// New returns a fresh store reading the time from now: empty for the
	// memory store, under a key prefix of the test's own (KeyPrefix) for
	// Redis.
	New func(t *testing.T, now func() time.Time) tollgate.Store
}

// Stores returns the memory store and a Redis store on the server that
// client returns a client of.
func Stores(client func(testing.TB) *redis.Client) []Store {
	return []Store{
		{"memory", func(t *testing.T, now func() time.Time) tollgate.Store {
			return memorystore.New(memorystore.WithClock(now))
		}},
		{"redis", func(t *testing.T, now func() time.Time) tollgate.Store {
			return redisstore.New(client(t), redisstore.WithClock(now), redisstore.WithPrefix(KeyPrefix(t)))
		}},
	}
}

// EachStore runs f at every store of Stores(client), as parallel subtests.
func EachStore(t *testing.T, client func(testing.TB) *redis.Client, f func(t *testing.T, s Store)) {
	t.Helper()
	for _, s := range Stores(client) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			f(t, s)
		})
	}
}
