package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

// Changes is Differential for keys whose limit changes under them: each call
// picks, for its algorithm, one of several rates and bursts of one period
// (state is kept per algorithm and period, so they all share it), and the
// clock steps back as often as forward. The store b makes and memorystore
// must return the same Result at every step, and every RetryAfter must be
// exact: replaying the key's calls into a fresh memorystore, the same
// request 1µs before now+RetryAfter is denied and at it admitted. (Not for a
// bucket last written under another limit: it expires when it would have
// been full, or empty, under that one, and decides as a fresh key from then
// on, which may be before the RetryAfter the new limit computes.)
//
// Redis expires keys in real time, memorystore on the test's clock. An
// expired window, log or GCRA state decides as a fresh one under any limit,
// but an expired token or leaky bucket does so only under the limit that
// wrote it (it was full, or empty, at the rate and burst of then). So the
// clock here stays within 30h of where it starts, while a bucket's state
// lives at least a token's time, 71h at 14 per 1000h: no bucket expires, in
// either store.
func Changes(t *testing.T, b Backend, steps int, seed uint64) {
	clock := NewClock()
	store := b.New(t, clock.Now)
	ref := memorystore.New(memorystore.WithClock(clock.Now))
	rng := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	ctx := context.Background()
	prefix := fmt.Sprintf("changes:%d:", rand.Int64())

	const (
		period = 1000 * time.Hour
		base   = 500 * time.Hour
		reach  = 30 * time.Hour
	)
	type variant struct{ rate, burst int }
	variants := map[tollgate.Algorithm][]variant{
		tollgate.TokenBucket:          {{7, 9}, {3, 4}, {5, 12}, {11, 2}, {14, 9}},
		tollgate.GCRA:                 {{7, 9}, {3, 4}, {5, 12}, {11, 2}, {14, 9}, {999_983, 5}},
		tollgate.LeakyBucket:          {{7, 9}, {3, 4}, {5, 12}, {11, 2}, {14, 9}},
		tollgate.FixedWindow:          {{9, 0}, {3, 0}, {14, 0}},
		tollgate.SlidingWindowLog:     {{9, 0}, {3, 0}, {14, 0}},
		tollgate.SlidingWindowCounter: {{9, 0}, {3, 0}, {14, 0}},
	}
	history := map[string][]changeCall{}
	wrote := map[string]tollgate.Limit{} // by key and algorithm
	algorithms := tollgate.Algorithms()
	now := base
	probed := 0
	defer func() { t.Logf("RetryAfter probed on %d denials", probed) }()
	for i := 0; i < steps; i++ {
		step := time.Duration(rng.IntN(int(2*time.Hour/time.Microsecond))) * time.Microsecond
		switch r := rng.IntN(100); {
		case r < 40:
		case r < 70:
			now = min(now+step, base+reach)
		default:
			now = max(now-step, base-reach)
		}
		clock.Set(now)
		a := algorithms[rng.IntN(len(algorithms))]
		v := variants[a][rng.IntN(len(variants[a]))]
		limit := tollgate.Limit{Algorithm: a, Rate: v.rate, Period: period, Burst: v.burst}
		if a == tollgate.LeakyBucket && rng.IntN(2) == 0 {
			limit.MaxDelay = time.Duration(1+rng.IntN(3)) * 10 * time.Hour
		}
		key := prefix + fmt.Sprint(rng.IntN(3))
		n := rng.IntN(min(limit.Capacity(), 20) + 1)
		want, werr := ref.AllowN(ctx, key, limit, n)
		got, gerr := store.AllowN(ctx, key, limit, n)
		if (werr == nil) != (gerr == nil) || got != want {
			t.Fatalf("step %d: %s key %s n %d at T0%+v:\nstore  %+v (err %v)\nmemory %+v (err %v)", i, limit, key, n, now, got, gerr, want, werr)
		}
		history[key] = append(history[key], changeCall{now, limit, n})
		state := key + ":" + a.String()
		if want.Allowed {
			if n > 0 {
				wrote[state] = limit
			}
			continue
		}
		if (a == tollgate.TokenBucket || a == tollgate.LeakyBucket) && wrote[state] != limit {
			continue
		}
		probed++
		probeRetryAfter(t, i, key, history[key], limit, n, now, want.RetryAfter)
	}
}

// changeCall is a call of Changes, as probeRetryAfter replays it.
type changeCall struct {
	at    time.Duration
	limit tollgate.Limit
	n     int
}

// probeRetryAfter replays calls, the history of key, into a fresh
// memorystore and requires the call of step i (n under limit, at now),
// denied with RetryAfter retry, to be denied again 1µs before now+retry and
// admitted at it.
func probeRetryAfter(t *testing.T, i int, key string, calls []changeCall, limit tollgate.Limit, n int, now, retry time.Duration) {
	ctx := context.Background()
	// Replay, then probe 1µs before the retry and at it.
	probeClock := NewClock()
	probe := memorystore.New(memorystore.WithClock(probeClock.Now))
	for _, c := range calls {
		probeClock.Set(c.at)
		if _, err := probe.AllowN(ctx, key, c.limit, c.n); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []struct {
		at   time.Duration
		want bool
	}{{now + retry - time.Microsecond, false}, {now + retry, true}} {
		probeClock.Set(p.at)
		res, err := probe.AllowN(ctx, key, limit, n)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed != p.want {
			t.Fatalf("step %d: %s key %s n %d at T0%+v: RetryAfter %v, but at T0%+v Allowed = %v", i, limit, key, n, now, retry, p.at, res.Allowed)
		}
	}
}
