// Package sim runs a client's traffic through tollgate's six algorithms and
// measures what each lets through, to choose an algorithm and a limit from
// numbers instead of prose. `tollgate simulate` is its command.
//
// A simulation is exact and instant: every algorithm decides on the memory
// store — the same integer arithmetic as the Redis scripts — under a virtual
// clock that jumps from one request to the next, so twenty seconds of
// traffic take microseconds and every run gives the same numbers. Optionally
// the same decisions are replayed through Redis (Config.Redis) to measure
// what the state costs there and to check that Redis decides identically.
//
// For each algorithm a Result counts what was admitted and denied, the most
// admitted in any span of the limit's period (the number a limit promises
// to bound), the decisions that differ from an exact sliding log's, and the
// bytes of state a key holds. WriteTable and WriteSVG present a Report;
// Recommend suggests a limit for a recorded traffic.
package sim

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// Config is what a simulation runs under.
type Config struct {
	// Limit gives the rate, period and burst every algorithm runs with; its
	// Algorithm and MaxDelay are ignored. The window algorithms admit Rate
	// per Period and ignore Burst.
	Limit tollgate.Limit
	// MaxDelay makes the leaky bucket a shaper (see tollgate.LeakyBucket):
	// requests that would overflow it are admitted with a delay of up to
	// MaxDelay, and are counted when they leave. 0 makes it a policer, which
	// decides exactly as the token bucket does.
	MaxDelay time.Duration
	// LeakyBurst is the leaky bucket's burst, when it differs from
	// Limit.Burst (0 keeps Limit.Burst). A shaper with a burst of 1 lets
	// requests out evenly spaced at the rate: the fixed output rate that a
	// fragile backend wants.
	LeakyBurst int
	// Redis, when set, replays every decision through redisstore on it
	// with the same virtual clock: Run fails if Redis decides differently
	// from memory, and each Result's RedisBytes is the most MEMORY USAGE
	// reported for the key.
	Redis redis.UniversalClient
}

// Result is what one algorithm did with a Traffic.
type Result struct {
	// Limit is the limit the algorithm ran with.
	Limit tollgate.Limit
	// Admitted and Denied count the requests.
	Admitted, Denied int
	// LogAdmitted is how many requests an exact sliding window log of the
	// same rate and period admitted from the same traffic.
	LogAdmitted int
	// Leaves are the times admitted requests go through, sorted: when they
	// arrived, plus the shaping delay of a leaky bucket with MaxDelay.
	Leaves []time.Duration
	// MaxDelay is the longest delay a request was given (shaping only).
	MaxDelay time.Duration
	// MaxInPeriod is the most requests that went through in any span of
	// the limit's period: at most Rate for an exact limit.
	MaxInPeriod int
	// Over counts admitted requests that an exact sliding log would have
	// denied, given what had gone through in the period before them: each
	// one broke the promise of at most Rate in any Period. Under counts
	// denied requests it would have admitted: fewer than Rate had gone
	// through in the period before them. For the sliding window log both
	// are 0. A shaper denies when its queue is full, with requests still
	// waiting to leave, so Under does not apply to it and is -1.
	Over, Under int
	// MemoryBytes is the most bytes of state the key held in memorystore;
	// RedisBytes, in Redis (MEMORY USAGE, key name and overhead included),
	// or 0 when Config.Redis was not set.
	MemoryBytes, RedisBytes int
}

// Report is a Traffic run through every algorithm.
type Report struct {
	Traffic Traffic
	Config  Config
	// Results has one entry per algorithm, in tollgate.Algorithms order.
	Results []Result
}

// base is the virtual clock's start: a whole number of periods since the
// Unix epoch for any period dividing a day, so fixed windows begin with the
// traffic.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs tr through every algorithm under cfg.
func Run(ctx context.Context, tr Traffic, cfg Config) (Report, error) {
	rep := Report{Traffic: tr, Config: cfg}
	if len(tr.Times) == 0 {
		return rep, fmt.Errorf("sim: %s has no requests", tr.Name)
	}
	if !slices.IsSorted(tr.Times) || tr.Times[0] < 0 {
		return rep, fmt.Errorf("sim: %s: request times must be sorted and not negative", tr.Name)
	}
	limits, err := cfg.limits()
	if err != nil {
		return rep, err
	}
	for _, l := range limits {
		res, err := run(ctx, tr, l, cfg.Redis)
		if err != nil {
			return rep, err
		}
		rep.Results = append(rep.Results, res)
	}
	var log int
	for _, r := range rep.Results {
		if r.Limit.Algorithm == tollgate.SlidingWindowLog {
			log = r.Admitted
		}
	}
	for i := range rep.Results {
		rep.Results[i].LogAdmitted = log
	}
	return rep, nil
}

// Check reports whether every algorithm can run under cfg: the error of
// the first limit that does not validate (errors.Is
// tollgate.ErrInvalidLimit).
func (cfg Config) Check() error {
	_, err := cfg.limits()
	return err
}

// limits returns the limit each algorithm runs with under cfg, in
// tollgate.Algorithms order.
func (cfg Config) limits() ([]tollgate.Limit, error) {
	var limits []tollgate.Limit
	for _, a := range tollgate.Algorithms() {
		l := cfg.Limit
		l.Algorithm, l.MaxDelay = a, 0
		if a == tollgate.LeakyBucket {
			l.MaxDelay = cfg.MaxDelay
			if cfg.LeakyBurst > 0 {
				l.Burst = cfg.LeakyBurst
			}
		}
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		limits = append(limits, l)
	}
	return limits, nil
}

func run(ctx context.Context, tr Traffic, l tollgate.Limit, rdb redis.UniversalClient) (Result, error) {
	res := Result{Limit: l}
	// Align the start to the period, so windows begin with the traffic.
	p := l.Period.Microseconds()
	start := time.UnixMicro(base.UnixMicro() / p * p).UTC()
	var now time.Time
	clock := func() time.Time { return now }
	mem := memorystore.New(memorystore.WithClock(clock), memorystore.WithShards(1))
	const key = "client"

	var (
		rs   *redisstore.Store
		rkey string // the simulation's own key: a fixed length, so its bytes are too
	)
	if rdb != nil {
		rs = redisstore.New(rdb, redisstore.WithClock(clock), redisstore.WithPrefix("tollgate-sim:"))
		rkey = "client:" + rand.Text()[:12]
		defer rs.Reset(context.WithoutCancel(ctx), rkey, l)
	}

	denied := make([]time.Duration, 0, len(tr.Times)/2)
	for i, at := range tr.Times {
		now = start.Add(at)
		d, err := mem.AllowN(ctx, key, l, 1)
		if err != nil {
			return res, fmt.Errorf("sim: %s at %v: %w", l.Algorithm, at, err)
		}
		if rs != nil {
			rd, err := rs.AllowN(ctx, rkey, l, 1)
			if err != nil {
				return res, fmt.Errorf("sim: %s at %v: %w", l.Algorithm, at, err)
			}
			rd.Limit, d.Limit = l, l
			if rd != d {
				return res, fmt.Errorf("sim: %s, request %d at %v: Redis decided %+v, memory %+v", l.Algorithm, i, at, rd, d)
			}
			if d.Allowed {
				n, err := redisBytes(ctx, rdb, rs.Key(rkey, l))
				if err != nil {
					return res, fmt.Errorf("sim: %s: %w", l.Algorithm, err)
				}
				res.RedisBytes = max(res.RedisBytes, n)
			}
		}
		if !d.Allowed {
			res.Denied++
			denied = append(denied, at)
			continue
		}
		res.Admitted++
		res.Leaves = append(res.Leaves, at+d.Delay)
		res.MaxDelay = max(res.MaxDelay, d.Delay)
		res.MemoryBytes = max(res.MemoryBytes, mem.StateBytes(key, l))
	}
	slices.Sort(res.Leaves) // a shaper's delays keep them in order; be sure
	res.MaxInPeriod = maxInPeriod(res.Leaves, l.Period)
	res.Over, res.Under = againstLog(res.Leaves, denied, l.Rate, l.Period)
	if l.MaxDelay > 0 {
		res.Under = -1
	}
	return res, nil
}

// redisBytes returns MEMORY USAGE of key, counting every element (SAMPLES
// 0), and removes the key's TTL: the replay runs faster than the virtual
// clock, but Redis counts TTLs in real time, and must not let a key expire
// before the simulation reaches that moment. (A key outliving its TTL
// decides as a fresh one would: that is what the TTL is.)
func redisBytes(ctx context.Context, rdb redis.UniversalClient, key string) (int, error) {
	var usage *redis.IntCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Persist(ctx, key)
		usage = p.MemoryUsage(ctx, key, 0)
		return nil
	})
	if errors.Is(err, redis.Nil) {
		// The key's TTL ran out in real time between the decision and
		// PERSIST: a request admitted a few µs of virtual time before its
		// state was full again (a window's end) sets a TTL of a
		// millisecond, which a busy machine can outlast. There is nothing
		// to measure; the next decision finds no key, as it would.
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("MEMORY USAGE %s: %w", key, err)
	}
	return int(usage.Val()), nil
}

// maxInPeriod returns the most times that fall within any span of length
// period: the most t[j] with t[i] ≤ t[j] < t[i] + period, for sorted times.
func maxInPeriod(times []time.Duration, period time.Duration) int {
	most, i := 0, 0
	for j, t := range times {
		for t-times[i] >= period {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}

// againstLog compares decisions with an exact sliding window log of rate
// per period, request by request, given what went through: an admitted
// request is over if, with it, more than rate went through in the period
// ending at it; a denied request is under if fewer than rate went through
// in the period ending at it, so it would have fit. (The period ending at t
// is (t − period, t], as the log counts it.)
func againstLog(leaves, denied []time.Duration, rate int, period time.Duration) (over, under int) {
	i := 0
	for j, t := range leaves {
		for t-leaves[i] >= period {
			i++
		}
		if j-i+1 > rate {
			over++
		}
	}
	for _, t := range denied {
		hi := sort.Search(len(leaves), func(k int) bool { return leaves[k] > t })
		lo := sort.Search(len(leaves), func(k int) bool { return leaves[k] > t-period })
		if hi-lo < rate {
			under++
		}
	}
	return over, under
}
