package lab

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/redisstore"
)

// BucketLimit is the demos' bucket: 2 tokens per second, capacity 5.
// Small enough to watch drain and refill by eye.
var BucketLimit = tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 2, Period: time.Second, Burst: 5}

// DrainCalls is how many quick calls Drain makes: twice the capacity.
const DrainCalls = 10

// DefaultRefillWait is how long Refill waits after draining the bucket:
// 2/s × 3 s would be 6 tokens, so the bucket is full (5) again.
const DefaultRefillWait = 3 * time.Second

// retryGrain is what retry-after is rounded up to when printed: the calls
// of a demo take a few milliseconds, so the exact µs differ from run to run
// while the rounded value does not.
const retryGrain = 100 * time.Millisecond

// Bucket loads the token-bucket script into the server's script cache
// (SCRIPT LOAD), checks that the SHA the server returns is the SHA-1 of the
// source, and prints it with the arguments of an EVALSHA call for the
// demos' bucket (BucketLimit).
func Bucket(ctx context.Context, rdb redis.Scripter, w io.Writer) error {
	src := redisstore.Source(tollgate.TokenBucket)
	sha, err := rdb.ScriptLoad(ctx, src).Result()
	if err != nil {
		return fmt.Errorf("lab: SCRIPT LOAD: %w", err)
	}
	sum := sha1.Sum([]byte(src))
	if want := hex.EncodeToString(sum[:]); sha != want {
		return fmt.Errorf("lab: SCRIPT LOAD returned %s, but the script's SHA-1 is %s", sha, want)
	}
	p, err := BucketLimit.Params()
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	fmt.Fprintf(w, "# SCRIPT LOAD redisstore's token bucket (lua/lib.lua + lua/token_bucket.lua, %d bytes)\n", len(src))
	fmt.Fprintf(w, "sha=%s\n", sha)
	// The arguments are the integers redisstore passes: tokens are counted
	// in units, see the script's header.
	fmt.Fprintf(w, "# try it: redis-cli EVALSHA %s 1 mybucket %d %d %d 1 '' %d\n", sha, p.UnitRate, p.Unit, p.Burst, p.MaxDebt)
	fmt.Fprintf(w, "#   that is %s, cost 1, Redis time, a debt of at most %d; tokens are counted in units, %d a token, %d added per µs\n", describe(BucketLimit), p.MaxDebt, p.Unit, p.UnitRate)
	return nil
}

// Drain makes DrainCalls quick calls on a fresh key of BucketLimit and
// prints one line each: the first five are admitted, one token each, and
// the rest are denied with the time until the next token.
func Drain(ctx context.Context, rdb redis.UniversalClient, w io.Writer) error {
	lim := tollgate.New(redisstore.New(rdb))
	key := freshKey("drain")
	fmt.Fprintf(w, "# %s, fresh key: %d quick calls\n", describe(BucketLimit), DrainCalls)
	for range DrainCalls {
		res, err := lim.Allow(ctx, key, BucketLimit)
		if err != nil {
			return fmt.Errorf("lab: drain: %w", err)
		}
		fmt.Fprintln(w, line(res))
	}
	return nil
}

// Refill drains a fresh bucket, waits, prints how many tokens it holds then
// (tokens=5 after DefaultRefillWait: 2/s × 3 s, capped at the capacity) by
// looking without spending, and shows that exactly that many quick calls
// pass and the next does not.
func Refill(ctx context.Context, rdb redis.UniversalClient, w io.Writer, wait time.Duration) error {
	lim := tollgate.New(redisstore.New(rdb))
	key := freshKey("refill")
	fmt.Fprintf(w, "# %s, fresh key: drain it, wait %v, look, then spend what is there and one more\n", describe(BucketLimit), wait)
	allowed := 0
	for range DrainCalls {
		res, err := lim.Allow(ctx, key, BucketLimit)
		if err != nil {
			return fmt.Errorf("lab: refill: %w", err)
		}
		if res.Allowed {
			allowed++
		}
	}
	fmt.Fprintf(w, "drain: %d allowed, %d denied\n", allowed, DrainCalls-allowed)
	fmt.Fprintf(w, "wait %v\n", wait)
	if err := sleep(ctx, wait); err != nil {
		return fmt.Errorf("lab: refill: %w", err)
	}
	res, err := lim.Peek(ctx, key, BucketLimit)
	if err != nil {
		return fmt.Errorf("lab: refill: %w", err)
	}
	fmt.Fprintf(w, "tokens=%d\n", res.Remaining)
	for range res.Remaining + 1 {
		res, err := lim.Allow(ctx, key, BucketLimit)
		if err != nil {
			return fmt.Errorf("lab: refill: %w", err)
		}
		fmt.Fprintln(w, line(res))
	}
	return nil
}

// Skew shows that the token-bucket script does not reward a clock that went
// back. It spends four of five tokens at the server's time T, then calls
// with now = T − 3600 s, the way a client with a skewed clock (or a replica
// after a failover) would: the call spends the last token, the hour refills
// nothing, and the bucket keeps its time T — so when the clock is right
// again the bucket is as empty as it should be, not full from an hour of
// refill.
func Skew(ctx context.Context, rdb redis.UniversalClient, w io.Writer) error {
	const back = time.Hour
	store := redisstore.New(rdb)
	lim := tollgate.New(store)
	key := freshKey("skew")
	fmt.Fprintf(w, "# %s, fresh key; T is the Redis server's time\n", describe(BucketLimit))

	var res tollgate.Result
	var err error
	for range BucketLimit.Burst - 1 {
		if res, err = lim.Allow(ctx, key, BucketLimit); err != nil {
			return fmt.Errorf("lab: skew: %w", err)
		}
		if !res.Allowed {
			return fmt.Errorf("lab: skew: a fresh bucket denied a call: %+v", res)
		}
	}
	fmt.Fprintf(w, "now=T        %d calls allowed, tokens=%d\n", BucketLimit.Burst-1, res.Remaining)

	// The same script and key, given an explicit now an hour in the past.
	var skewed time.Time
	past := tollgate.New(redisstore.New(rdb, redisstore.WithClock(func() time.Time { return skewed })))
	for range 2 {
		t, err := rdb.Time(ctx).Result()
		if err != nil {
			return fmt.Errorf("lab: skew: TIME: %w", err)
		}
		skewed = t.Add(-back)
		if res, err = past.Allow(ctx, key, BucketLimit); err != nil {
			return fmt.Errorf("lab: skew: %w", err)
		}
		if res.Allowed {
			fmt.Fprintf(w, "now=T-%ds  %s   (an hour back refills nothing; the bucket keeps its time T)\n", int(back.Seconds()), line(res))
		} else {
			fmt.Fprintf(w, "now=T-%ds  %s   (from then: wait for T, then for a token)\n", int(back.Seconds()), line(res))
		}
	}

	if res, err = lim.Peek(ctx, key, BucketLimit); err != nil {
		return fmt.Errorf("lab: skew: %w", err)
	}
	fmt.Fprintf(w, "now=T        tokens=%d   (not rewarded: a bucket that had stored T-%ds would count an hour of refill, tokens=%d)\n",
		res.Remaining, int(back.Seconds()), BucketLimit.Burst)
	return nil
}

// line prints one decision: allowed=1 remaining=4, or
// allowed=0 remaining=0 retry_after=500ms.
func line(r tollgate.Result) string {
	if r.Allowed {
		return fmt.Sprintf("allowed=1 remaining=%d", r.Remaining)
	}
	return fmt.Sprintf("allowed=0 remaining=%d retry_after=%v", r.Remaining, ceil(r.RetryAfter, retryGrain))
}

// describe names a token bucket by its rate and capacity.
func describe(l tollgate.Limit) string {
	return fmt.Sprintf("token bucket %d/%s, capacity %d", l.Rate, strings.TrimPrefix(l.Period.String(), "1"), l.Burst)
}

// ceil rounds d up to a multiple of grain.
func ceil(d, grain time.Duration) time.Duration {
	return (d + grain - 1) / grain * grain
}

// freshKey returns a key no earlier run has used, so every run starts from
// a full bucket without flushing anything.
func freshKey(demo string) string {
	return "lab:" + demo + ":" + rand.Text()[:12]
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
