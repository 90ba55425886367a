package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	sethmem "github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
	uber "go.uber.org/ratelimit"
	xrate "golang.org/x/time/rate"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
)

// row is one line of a table: how to build its decider, and what it is.
type row struct {
	name string
	// peer names the library for ratio columns; "" for tollgate's rows.
	peer string
	// build returns the decider; it may use rdb (Redis rows).
	build func(rdb *redis.Client) (op, error)
	note  string
}

// The limit every Redis row decides under: far above what 10,000 keys see
// at these rates, so every decision is admitted and writes (the usual
// path). The "abusive" rows use abusive instead: 6 per minute with a burst
// of 1, a few percent or less of what each key is sent, so nearly all
// decisions are denials (97.5% at 40,000 decisions/s over 10,000 keys).
var (
	perSecond = 1000
	abusive   = tollgate.Limit{Rate: 6, Period: time.Minute, Burst: 1}
)

func tollgateLimit(a tollgate.Algorithm) tollgate.Limit {
	return tollgate.Limit{Algorithm: a, Rate: perSecond, Period: time.Second, Burst: perSecond}
}

func storeOp(s tollgate.Store, limit tollgate.Limit) op {
	return func(ctx context.Context, key string) error {
		_, err := s.AllowN(ctx, key, limit, 1)
		return err
	}
}

func redisRows(pipeWindow time.Duration, pipeBatch int) []row {
	var rows []row
	plain := func(rdb *redis.Client) (*redisstore.Store, error) {
		s := redisstore.New(rdb)
		return s, s.Load(context.Background())
	}
	piped := func(rdb *redis.Client) (*redisstore.Store, error) {
		s := redisstore.New(rdb, redisstore.WithPipeline(pipeWindow, pipeBatch))
		return s, s.Load(context.Background())
	}
	for _, a := range tollgate.Algorithms() {
		rows = append(rows, row{name: "tollgate redisstore " + a.String(), build: func(rdb *redis.Client) (op, error) {
			s, err := plain(rdb)
			return storeOp(s, tollgateLimit(a)), err
		}})
	}
	for _, a := range tollgate.Algorithms() {
		rows = append(rows, row{name: "tollgate redisstore " + a.String() + ", pipelined", build: func(rdb *redis.Client) (op, error) {
			s, err := piped(rdb)
			return storeOp(s, tollgateLimit(a)), err
		}, note: fmt.Sprintf("WithPipeline(%v, %d)", pipeWindow, pipeBatch)})
	}
	// Without Load the store runs scripts (EVALSHA) instead of the function
	// library (FCALL): what the library saves, in the same run.
	rows = append(rows, row{name: "tollgate redisstore token_bucket, scripts", build: func(rdb *redis.Client) (op, error) {
		s := redisstore.New(rdb)
		return storeOp(s, tollgateLimit(tollgate.TokenBucket)), redis.NewScript(redisstore.Source(tollgate.TokenBucket)).Load(context.Background(), rdb).Err()
	}, note: "EVALSHA: no function library"})
	// Pipelined with every decision its own script call, as before
	// WithPipeline batched: what batching adds, in the same run.
	for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.GCRA} {
		rows = append(rows, row{name: "tollgate redisstore " + a.String() + ", pipelined, unbatched", build: func(rdb *redis.Client) (op, error) {
			s := redisstore.New(rdb, redisstore.WithPipeline(pipeWindow, pipeBatch), redisstore.WithBatching(false))
			return storeOp(s, tollgateLimit(a)), s.Load(context.Background())
		}, note: fmt.Sprintf("WithPipeline(%v, %d), WithBatching(false)", pipeWindow, pipeBatch)})
	}
	rows = append(rows,
		row{name: "tollgate tiered over redisstore token_bucket", build: func(rdb *redis.Client) (op, error) {
			s, err := plain(rdb)
			return storeOp(tiered.New(s, tiered.WithTimeout(0)), tollgateLimit(tollgate.TokenBucket)), err
		}, note: "admitted path: the local tier adds its bookkeeping"},
		row{name: "tollgate tiered over pipelined redisstore token_bucket", build: func(rdb *redis.Client) (op, error) {
			s, err := piped(rdb)
			return storeOp(tiered.New(s, tiered.WithTimeout(0)), tollgateLimit(tollgate.TokenBucket)), err
		}},
		row{name: "go-redis/redis_rate v10 (GCRA)", peer: "redis_rate", build: func(rdb *redis.Client) (op, error) {
			l := redis_rate.NewLimiter(rdb)
			limit := redis_rate.PerSecond(perSecond)
			return func(ctx context.Context, key string) error {
				_, err := l.Allow(ctx, key, limit)
				return err
			}, nil
		}},
		row{name: "ulule/limiter v3 redis store (fixed window)", peer: "ulule", build: func(rdb *redis.Client) (op, error) {
			store, err := ululeredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: "ulule", MaxRetry: 3})
			if err != nil {
				return nil, err
			}
			l := ulule.New(store, ulule.Rate{Period: time.Second, Limit: int64(perSecond)})
			return func(ctx context.Context, key string) error {
				_, err := l.Get(ctx, key)
				return err
			}, nil
		}},
		// 99% denied: where the tiered store's denial cache pays.
		row{name: "abusive (99% denied): tollgate redisstore token_bucket", build: func(rdb *redis.Client) (op, error) {
			s, err := plain(rdb)
			return storeOp(s, abusive), err
		}},
		row{name: "abusive (99% denied): tollgate tiered over redisstore", build: func(rdb *redis.Client) (op, error) {
			s, err := plain(rdb)
			return storeOp(tiered.New(s, tiered.WithTimeout(0)), abusive), err
		}, note: "denials answered locally"},
		row{name: "abusive (99% denied): go-redis/redis_rate v10", peer: "redis_rate (abusive)", build: func(rdb *redis.Client) (op, error) {
			l := redis_rate.NewLimiter(rdb)
			limit := redis_rate.Limit{Rate: 6, Period: time.Minute, Burst: 1}
			return func(ctx context.Context, key string) error {
				_, err := l.Allow(ctx, key, limit)
				return err
			}, nil
		}},
	)
	return rows
}

// The in-memory rows: a million per hour per key with a burst of a million
// (x/time/rate: the same rate and burst; sethvargo: a million per hour;
// uber: a rate so high it never sleeps). Every decision is admitted and
// every key's state stays live (it refills about as fast as it is spent
// here, and is far from full or empty), so what is measured is each one's
// bookkeeping on a key it already holds — the steady state of a busy
// service. (A limit so generous that a key is back to full between two
// calls would make memorystore reclaim and recreate the state each time.)
const memRate = 1_000_000

var memLimit = tollgate.PerHour(memRate)

// oneKey is the shape of sethvargo/go-limiter's own parallel benchmark
// (benchmarks/sethvargo_test.go, "memory/parallel"): every goroutine takes
// from the same key (its session table is never filled, so every call uses
// one key) under a limit that is never reached (MaxUint64 tokens there; a
// trillion per second here, the largest round limit tollgate counts exactly).
var oneKey = tollgate.PerSecond(1_000_000_000_000)

func memoryRows() []row {
	return []row{
		{name: "tollgate memorystore token_bucket", build: func(*redis.Client) (op, error) {
			return storeOp(memorystore.New(), memLimit), nil
		}},
		{name: "tollgate memorystore gcra", build: func(*redis.Client) (op, error) {
			return storeOp(memorystore.New(), tollgate.Limit{Algorithm: tollgate.GCRA, Rate: memRate, Period: time.Hour, Burst: memRate}), nil
		}},
		{name: "tollgate memorystore sliding_window_counter", build: func(*redis.Client) (op, error) {
			return storeOp(memorystore.New(), tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: memRate, Period: time.Hour}), nil
		}},
		{name: "sethvargo/go-limiter memorystore", peer: "sethvargo", build: func(*redis.Client) (op, error) {
			s, err := sethmem.New(&sethmem.Config{Tokens: memRate, Interval: time.Hour})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, key string) error {
				_, _, _, _, err := s.Take(ctx, key)
				return err
			}, nil
		}},
		{name: "one key: tollgate memorystore token_bucket", build: func(*redis.Client) (op, error) {
			s := memorystore.New()
			return func(ctx context.Context, _ string) error {
				_, err := s.AllowN(ctx, "k", oneKey, 1)
				return err
			}, nil
		}},
		{name: "one key: sethvargo/go-limiter memorystore", peer: "sethvargo (one key)", build: func(*redis.Client) (op, error) {
			s, err := sethmem.New(&sethmem.Config{Tokens: math.MaxUint64, Interval: time.Duration(math.MaxInt64), SweepInterval: time.Duration(math.MaxInt64), SweepMinTTL: time.Duration(math.MaxInt64)})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, _ string) error {
				_, _, _, _, err := s.Take(ctx, "k")
				return err
			}, nil
		}},
		{name: "golang.org/x/time/rate, one per key in a sync.Map", peer: "x/time/rate", build: func(*redis.Client) (op, error) {
			var m sync.Map
			return func(_ context.Context, key string) error {
				l, ok := m.Load(key)
				if !ok {
					l, _ = m.LoadOrStore(key, xrate.NewLimiter(xrate.Limit(memRate/3600.0), memRate))
				}
				l.(*xrate.Limiter).Allow()
				return nil
			}, nil
		}},
		{name: "go.uber.org/ratelimit, one per key in a sync.Map", peer: "uber", build: func(*redis.Client) (op, error) {
			var m sync.Map
			return func(_ context.Context, key string) error {
				l, ok := m.Load(key)
				if !ok {
					l, _ = m.LoadOrStore(key, uber.New(memRate*1000, uber.WithoutSlack))
				}
				l.(uber.Limiter).Take()
				return nil
			}, nil
		}, note: "blocking Take; a rate so high it never sleeps"},
	}
}
