package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	sethmem "github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
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

// redisRows are the Redis rows. A tollgate store made by redisstore.New
// with no option pipelines concurrent decisions (as WithPipeline(1ms, 64));
// the "unpipelined" rows turn that off, one round trip a decision, as the
// peers make them.
func redisRows(pipeWindow time.Duration, pipeBatch int) []row {
	var rows []row
	loaded := func(s *redisstore.Store) (*redisstore.Store, error) {
		return s, s.Load(context.Background())
	}
	defaults := func(rdb *redis.Client) (*redisstore.Store, error) {
		if pipeWindow == time.Millisecond && pipeBatch == 64 {
			return loaded(redisstore.New(rdb))
		}
		return loaded(redisstore.New(rdb, redisstore.WithPipeline(pipeWindow, pipeBatch)))
	}
	note := fmt.Sprintf("default: pipelined, WithPipeline(%v, %d)", pipeWindow, pipeBatch)
	for _, a := range tollgate.Algorithms() {
		rows = append(rows, row{name: "tollgate redisstore " + a.String(), build: func(rdb *redis.Client) (op, error) {
			s, err := defaults(rdb)
			return storeOp(s, tollgateLimit(a)), err
		}, note: note})
	}
	for _, a := range tollgate.Algorithms() {
		rows = append(rows, row{name: "tollgate redisstore " + a.String() + ", unpipelined", build: func(rdb *redis.Client) (op, error) {
			s, err := loaded(redisstore.New(rdb, redisstore.WithPipeline(0, 0)))
			return storeOp(s, tollgateLimit(a)), err
		}, note: "WithPipeline(0, 0): one round trip a decision"})
	}
	// Without Load the store runs scripts (EVALSHA) instead of the function
	// library (FCALL): what the library saves, in the same run.
	rows = append(rows, row{name: "tollgate redisstore token_bucket, scripts", build: func(rdb *redis.Client) (op, error) {
		s := redisstore.New(rdb, redisstore.WithPipeline(pipeWindow, pipeBatch))
		return storeOp(s, tollgateLimit(tollgate.TokenBucket)), redis.NewScript(redisstore.Source(tollgate.TokenBucket)).Load(context.Background(), rdb).Err()
	}, note: "pipelined, EVALSHA: no function library"})
	// Pipelined with every decision its own script call: what batching
	// adds, in the same run.
	for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.GCRA} {
		rows = append(rows, row{name: "tollgate redisstore " + a.String() + ", pipelined, unbatched", build: func(rdb *redis.Client) (op, error) {
			s := redisstore.New(rdb, redisstore.WithPipeline(pipeWindow, pipeBatch), redisstore.WithBatching(false))
			return storeOp(s, tollgateLimit(a)), s.Load(context.Background())
		}, note: fmt.Sprintf("WithPipeline(%v, %d), WithBatching(false)", pipeWindow, pipeBatch)})
	}
	rows = append(rows,
		row{name: "tollgate tiered over redisstore token_bucket", build: func(rdb *redis.Client) (op, error) {
			s, err := defaults(rdb)
			return storeOp(tiered.New(s, tiered.WithTimeout(0)), tollgateLimit(tollgate.TokenBucket)), err
		}, note: "admitted path: the local tier adds its bookkeeping"},
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
			s, err := defaults(rdb)
			return storeOp(s, abusive), err
		}},
		row{name: "abusive (99% denied): tollgate tiered over redisstore", build: func(rdb *redis.Client) (op, error) {
			s, err := defaults(rdb)
			return storeOp(tiered.New(s, tiered.WithTimeout(0), tiered.WithDenialCache()), abusive), err
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

// The in-memory rows decide over 100,000 live keys, every call admitted: a
// limit of 100 per hour with a burst of a million (throttled: the same
// GCRA quota; sethvargo, which has no separate burst: a million per hour,
// counted per hourly tick, so it never refills during a run). No key's
// state is ever back to full or empty during a run (a key refills one
// token every 36 s and is taken from a few thousand times at most), so what
// is measured is each one's bookkeeping on a key it already holds — the
// steady state of a busy service. tollgate's rows go through Limiter.Allow,
// the call an application makes.
const (
	memRate  = 100
	memBurst = 1_000_000
)

func memLimit(a tollgate.Algorithm) tollgate.Limit {
	l := tollgate.Limit{Algorithm: a, Rate: memRate, Period: time.Hour, Burst: memBurst}
	if a == tollgate.FixedWindow || a == tollgate.SlidingWindowCounter {
		l.Rate = memBurst // a window admits Rate per window
	}
	return l
}

// oneKey is the shape of sethvargo/go-limiter's own parallel benchmark
// (benchmarks/sethvargo_test.go, "memory/parallel"): every goroutine takes
// from the same key (its session table is never filled, so every call uses
// one key) under a limit that is never reached (MaxUint64 tokens there; a
// trillion per second here, the largest round limit tollgate counts exactly).
var oneKey = tollgate.PerSecond(1_000_000_000_000)

func limiterOp(l *tollgate.Limiter, limit tollgate.Limit) op {
	return func(ctx context.Context, key string) error {
		_, err := l.Allow(ctx, key, limit)
		return err
	}
}

func memoryRows() []row {
	var rows []row
	for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.GCRA, tollgate.SlidingWindowCounter} {
		rows = append(rows, row{name: "tollgate memorystore " + a.String(), build: func(*redis.Client) (op, error) {
			return limiterOp(tollgate.New(memorystore.New()), memLimit(a)), nil
		}, note: "Limiter.Allow"})
	}
	return append(rows,
		row{name: "throttled/v2 GCRA, memstore (plain map)", peer: "throttled", build: func(*redis.Client) (op, error) {
			st, err := throttledmem.NewCtx(0) // 0: a plain map, no LRU
			if err != nil {
				return nil, err
			}
			l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerHour(memRate), MaxBurst: memBurst - 1})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, key string) error {
				ok, _, err := l.RateLimitCtx(ctx, key, 1)
				if err == nil && ok { // ok means limited
					err = errors.New("throttled denied a call")
				}
				return err
			}, nil
		}, note: "RateLimitCtx"},
		row{name: "sethvargo/go-limiter memorystore", peer: "sethvargo", build: func(*redis.Client) (op, error) {
			s, err := sethmem.New(&sethmem.Config{Tokens: memBurst, Interval: time.Hour})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, key string) error {
				_, _, _, ok, err := s.Take(ctx, key)
				if err == nil && !ok {
					err = errors.New("sethvargo denied a call")
				}
				return err
			}, nil
		}, note: "Take"},
		row{name: "golang.org/x/time/rate, one per key in a sync.Map", peer: "x/time/rate", build: func(*redis.Client) (op, error) {
			var m sync.Map
			return func(_ context.Context, key string) error {
				l, ok := m.Load(key)
				if !ok {
					l, _ = m.LoadOrStore(key, xrate.NewLimiter(xrate.Limit(memRate/3600.0), memBurst))
				}
				if !l.(*xrate.Limiter).Allow() {
					return errors.New("x/time/rate denied a call")
				}
				return nil
			}, nil
		}},
		row{name: "go.uber.org/ratelimit, one per key in a sync.Map", peer: "uber", build: func(*redis.Client) (op, error) {
			var m sync.Map
			return func(_ context.Context, key string) error {
				l, ok := m.Load(key)
				if !ok {
					l, _ = m.LoadOrStore(key, uber.New(1_000_000_000, uber.WithoutSlack))
				}
				l.(uber.Limiter).Take()
				return nil
			}, nil
		}, note: "blocking Take; a rate so high it never sleeps"},
		row{name: "one key: tollgate memorystore token_bucket", build: func(*redis.Client) (op, error) {
			l := tollgate.New(memorystore.New())
			return func(ctx context.Context, _ string) error {
				_, err := l.Allow(ctx, "k", oneKey)
				return err
			}, nil
		}, note: "Limiter.Allow"},
		row{name: "one key: sethvargo/go-limiter memorystore", peer: "sethvargo (one key)", build: func(*redis.Client) (op, error) {
			s, err := sethmem.New(&sethmem.Config{Tokens: math.MaxUint64, Interval: time.Duration(math.MaxInt64), SweepInterval: time.Duration(math.MaxInt64), SweepMinTTL: time.Duration(math.MaxInt64)})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, _ string) error {
				_, _, _, _, err := s.Take(ctx, "k")
				return err
			}, nil
		}},
	)
}
