package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/model"
	"github.com/tollgate/tollgate/redisstore"
)

// bucketFields returns the fields of the bucket stored at name, in either
// of its forms: a token bucket's string 't:ts:u:e', or a hash (a leaky
// bucket's, or a token bucket an earlier version wrote). A key that does
// not exist has no fields (redis.Nil).
func bucketFields(ctx context.Context, rdb redis.UniversalClient, name string) (map[string]string, error) {
	v, err := rdb.Get(ctx, name).Result()
	switch {
	case err == nil:
		parts := strings.Split(v, ":")
		if len(parts) != 4 {
			return nil, fmt.Errorf("bucket %q: want t:ts:u:e", v)
		}
		return map[string]string{"t": parts[0], "ts": parts[1], "u": parts[2], "e": parts[3]}, nil
	case !redis.HasErrorPrefix(err, "WRONGTYPE"):
		return nil, err
	}
	h, err := rdb.HGetAll(ctx, name).Result()
	if err == nil && len(h) == 0 {
		return nil, redis.Nil
	}
	return h, err
}

// bucketField returns one field of the bucket at name (see bucketFields):
// redis.Nil when the key or the field does not exist.
func bucketField(ctx context.Context, rdb redis.UniversalClient, name, field string) (string, error) {
	h, err := bucketFields(ctx, rdb, name)
	if err != nil {
		return "", err
	}
	v, ok := h[field]
	if !ok {
		return "", redis.Nil
	}
	return v, nil
}

// toOldBucket rewrites the token bucket at name as tollgate stored it before
// it kept it as a string: a hash of t, ts and u, and e unless withoutE, with
// the TTL it had. A leaky bucket, always a hash, loses e when withoutE.
func toOldBucket(ctx context.Context, rdb redis.UniversalClient, name string, withoutE bool) error {
	v, err := rdb.Get(ctx, name).Result()
	if errors.Is(err, redis.Nil) {
		return nil // no bucket
	}
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		if withoutE {
			return rdb.HDel(ctx, name, "e").Err()
		}
		return nil
	}
	if err != nil {
		return err
	}
	parts := strings.Split(v, ":")
	if len(parts) != 4 {
		return fmt.Errorf("bucket %q: want t:ts:u:e", v)
	}
	ttl, err := rdb.PTTL(ctx, name).Result()
	if err != nil {
		return err
	}
	fields := []any{"t", parts[0], "ts", parts[1], "u", parts[2]}
	if !withoutE {
		fields = append(fields, "e", parts[3])
	}
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, name)
		p.HSet(ctx, name, fields...)
		if ttl > 0 {
			p.PExpire(ctx, name, ttl)
		}
		return nil
	})
	return err
}

// bucketInt returns one field of the bucket at name as an integer.
func bucketInt(ctx context.Context, rdb redis.UniversalClient, name, field string) (int64, error) {
	v, err := bucketField(ctx, rdb, name, field)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bucket field %s: %w", field, err)
	}
	return n, nil
}

// TestTokenBucketOldForm: a token bucket stored as a hash, as earlier
// versions of the store wrote it, decides as the model does — under its own
// limit and under a changed one, admitted, denied or looked at, and settled
// — and becomes a string at its next write. Before each call the key is
// rewritten in the old form half the time.
func TestTokenBucketOldForm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limits := []tollgate.Limit{
		{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 10},
		{Algorithm: tollgate.TokenBucket, Rate: 7, Period: time.Second, Burst: 4},
		{Algorithm: tollgate.TokenBucket, Rate: 1000, Period: time.Minute, Burst: 30},
	}
	for _, fn := range []bool{false, true} {
		t.Run(fmt.Sprintf("functions=%v", fn), func(t *testing.T) {
			t.Parallel()
			rdb := standalone(t)
			clock := conformance.NewClock()
			s := redisstore.New(rdb, redisstore.WithClock(clock.Now))
			if fn {
				if err := s.Load(ctx); err != nil {
					t.Fatal(err)
				}
			}
			m := model.New()
			r := rand.New(rand.NewPCG(1, 2))
			k := key(t)
			var at time.Duration
			var reserved []struct {
				limit tollgate.Limit
				at    int64
				n     int
			}
			for i := range 3000 {
				l := limits[r.IntN(len(limits))]
				if r.IntN(4) > 0 {
					l = limits[0]
				}
				name := s.Key(k, l)
				old := r.IntN(2) == 0
				if old {
					if err := toOldBucket(ctx, rdb, name, false); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				}
				at += time.Duration(r.IntN(300)) * time.Millisecond
				clock.Set(at)
				now := clock.Now().UnixMicro()
				var got, want tollgate.Result
				var err error
				wrote := false
				if len(reserved) > 0 && r.IntN(5) == 0 {
					c := reserved[r.IntN(len(reserved))]
					d := r.IntN(c.limit.Burst+1) - c.n // actual within the burst
					var merr error
					got, err = s.SettleN(ctx, k, c.limit, c.at, c.n, c.n+d)
					want, wrote, merr = m.SettleN(k, c.limit, c.at, c.n, c.n+d, now)
					wrote = wrote && want.ResetAfter > 0 // else refunded to full: deleted
					if merr != nil {
						t.Fatalf("step %d: the model refuses the settle: %v", i, merr)
					}
					if c.limit != l {
						name = s.Key(k, c.limit)
					}
				} else {
					n := r.IntN(l.Burst + 1)
					var reservedAt int64
					got, reservedAt, err = s.ReserveN(ctx, k, l, n)
					want, _ = m.AllowN(k, l, n, now)
					wrote = want.Allowed && n > 0
					if wrote {
						reserved = append(reserved, struct {
							limit tollgate.Limit
							at    int64
							n     int
						}{l, reservedAt, n})
					}
				}
				if err != nil {
					t.Fatalf("step %d (old form %v): %v", i, old, err)
				}
				if got != want {
					t.Fatalf("step %d (old form %v, at %v, %v):\n got %+v\nwant %+v", i, old, at, l, got, want)
				}
				if wrote {
					if typ, err := rdb.Type(ctx, name).Result(); err != nil || typ != "string" {
						t.Fatalf("step %d wrote the bucket: its key is a %s (%v), want a string", i, typ, err)
					}
				}
			}
		})
	}
}
