package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/permit"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/redisstore"
)

func concurrencyBackend(client func(*testing.T) redis.UniversalClient) conformance.ConcurrencyBackend {
	return conformance.ConcurrencyBackend{
		New: func(t *testing.T, now func() time.Time) tollgate.ConcurrencyStore {
			return redisstore.New(client(t), redisstore.WithClock(now))
		},
		Held: func(t *testing.T, s tollgate.ConcurrencyStore, key string, _ time.Time) (int, time.Duration) {
			rdb, k := client(t), s.(*redisstore.Store).ConcurrencyKey(key)
			n, err := rdb.ZCard(context.Background(), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			ttl, err := rdb.PTTL(context.Background(), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 && ttl == -1 { // go-redis: -1 for a key without a TTL
				t.Fatalf("%s holds %d permits and has no TTL (%v)", k, n, ttl)
			}
			return int(n), max(ttl, 0)
		},
		Keep: func(t *testing.T, s tollgate.ConcurrencyStore, key string) {
			if err := client(t).PExpire(context.Background(), s.(*redisstore.Store).ConcurrencyKey(key), time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		},
		// As for the rate limits: Redis counts TTLs in real milliseconds
		// while the test's clock stands still.
		TTLSlack: time.Second,
		TTLGrain: time.Millisecond,
	}
}

func TestConcurrencyConformance(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { conformance.RunConcurrency(t, concurrencyBackend(standalone)) })
	t.Run("cluster", func(t *testing.T) { conformance.RunConcurrency(t, concurrencyBackend(clustered)) })
}

func TestConcurrencyModel(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		conformance.ConcurrencyModel(t, concurrencyBackend(standalone), 3000, 1)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		conformance.ConcurrencyModel(t, concurrencyBackend(clustered), 1500, 2)
	})
}

// TestConcurrencyServerTime runs with no clock option: the scripts read
// Redis TIME, and a permit's Expires is the server's time plus the lease.
func TestConcurrencyServerTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	k := key(t)
	before, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	p, res, err := s.Acquire(ctx, k, 1, time.Minute)
	if err != nil || !res.Allowed {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	after, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if p.Expires.Before(before.Add(time.Minute)) || p.Expires.After(after.Add(time.Minute)) {
		t.Errorf("Expires = %v, want between %v and %v", p.Expires, before.Add(time.Minute), after.Add(time.Minute))
	}
	_, res, err = s.Acquire(ctx, k, 1, time.Minute)
	if err != nil || res.Allowed || res.RetryAfter <= 59*time.Second || res.RetryAfter > time.Minute {
		t.Errorf("second Acquire: %+v, %v; want a denial retrying in just under a minute", res, err)
	}
	if p, err = s.Renew(ctx, p, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.PTTL(ctx, s.ConcurrencyKey(k)).Result(); ttl <= 59*time.Minute || ttl > time.Hour+time.Millisecond { // the expiry is rounded up to a ms
		t.Errorf("TTL after renewing for an hour = %v", ttl)
	}
	if err := s.Release(ctx, p); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, s.ConcurrencyKey(k)).Result(); n != 0 {
		t.Errorf("the key outlived its last permit")
	}
}

// TestConcurrencyKeySlot: a key's permits share the Cluster slot of its rate
// limits, and the key's hash tag is the caller's key.
func TestConcurrencyKeySlot(t *testing.T) {
	t.Parallel()
	s := redisstore.New(server.Client(t), redisstore.WithPrefix("p:"))
	limit := tollgate.PerMinute(1)
	for _, tc := range []struct{ key, want string }{
		{"tenant:acme", "p:{tenant:acme}:conc"},
		{"a", "p:{a}:conc"},
	} {
		if got := s.ConcurrencyKey(tc.key); got != tc.want {
			t.Errorf("ConcurrencyKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
		rate := s.Key(tc.key, limit)
		if got, want := rate[:strings.Index(rate, "}")+1], tc.want[:strings.Index(tc.want, "}")+1]; got != want {
			t.Errorf("hash tags differ: %q, %q", got, want)
		}
	}
}

// TestConcurrencyCorruptKey: a key holding something tollgate did not write
// is an error, never a panic or a permit.
func TestConcurrencyCorruptKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb)
	k := key(t)
	if err := rdb.Set(ctx, s.ConcurrencyKey(k), "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	p, res, err := s.Acquire(ctx, k, 1, time.Second)
	if err == nil || res.Allowed || p != (tollgate.Permit{}) || !strings.HasPrefix(err.Error(), "redisstore: acquire: ") {
		t.Errorf("Acquire on a string key: %+v, %+v, %v; want a redisstore error", p, res, err)
	}
	good := tollgate.Permit{Key: k, ID: permit.NewID()}
	if err := s.Release(ctx, good); err == nil {
		t.Error("Release on a string key: no error")
	}
	if _, err := s.Renew(ctx, good, time.Second); err == nil || errors.Is(err, tollgate.ErrPermitExpired) {
		t.Errorf("Renew on a string key: %v; want a store error", err)
	}
}

// TestConcurrencyDeadRedis: a store that cannot answer is an error.
func TestConcurrencyDeadRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	_, res, err := redisstore.New(rdb).Acquire(context.Background(), "k", 1, time.Second)
	if err == nil || res.Allowed {
		t.Errorf("Acquire with no Redis: %+v, %v; want an error", res, err)
	}
}

func TestParseIntsReply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		reply any
		n     int
		ok    bool
	}{
		{"four integers", []any{int64(1), int64(2), int64(0), int64(9)}, 4, true},
		{"not an array", int64(1), 4, false},
		{"too short", []any{int64(1)}, 4, false},
		{"a string", []any{int64(1), "2", int64(0), int64(9)}, 4, false},
		{"negative", []any{int64(1), int64(-2), int64(0), int64(9)}, 4, false},
	} {
		_, err := redisstore.ParseInts(tc.reply, tc.n)
		if got, want := err == nil, tc.ok; got != want {
			t.Errorf("%s: err = %v, want ok %v", tc.name, err, want)
		}
	}
}
