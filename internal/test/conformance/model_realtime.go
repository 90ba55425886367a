package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/model"
)

// RealTimeTarget is a store checked against the reference model in real
// time: its state expires by the store's own means as time passes (a Redis
// TTL running out, lazily or by Redis's active expiry; the memory store's
// clock), and nothing is deleted for it.
type RealTimeTarget struct {
	// New returns the store under test, on a clock of its own: the Redis
	// server's TIME (a clock read when the call is sent would be read
	// before the script sets its TTL, by a delay Redis cannot know), or the
	// memory store's.
	New func(tb testing.TB) tollgate.Settler
	// SettleAt settles as s.SettleN does and also returns the store's time
	// of the settle, in µs.
	SettleAt func(ctx context.Context, s tollgate.Settler, key string, l tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, int64, error)
}

// ModelRealTime sends steps calls of a NewShortGen for alg, drawing from
// src, through the store target makes, and through the model at the
// instant the store made each (ReserveN's, SettleAt's), and requires every
// Result to be the model's: decisions, reservations, and settles of those
// reservations. Now and then it sleeps for up to a few of the limits'
// spans, so that state expires between calls, found by a later call or
// not (a look, a settle, another limit), or deleted by the store first.
func ModelRealTime(tb testing.TB, target RealTimeTarget, alg tollgate.Algorithm, src rand.Source, steps int) {
	tb.Helper()
	store := target.New(tb)
	gen := NewShortGen(alg, src)
	rng := rand.New(rand.NewPCG(src.Uint64(), src.Uint64()))
	oracle := model.New()
	ctx := context.Background()
	prefix := fmt.Sprintf("realtime:%d:", rand.Int64())
	history := map[string][]string{}
	var open []reservationMade
	// Calls that found state the model says has expired, which the store
	// may or may not still hold: the run must reach them.
	var expired int
	defer func() {
		tb.Logf("%d of %d calls found the key's state expired", expired, steps)
		if steps >= 1000 && expired == 0 {
			tb.Errorf("no call found state expired")
		}
	}()
	for i := range steps {
		c := gen.Next()
		key := prefix + fmt.Sprint(c.Key)
		switch r := rng.IntN(1000); {
		case r < 100:
			time.Sleep(time.Duration(rng.Int64N(shortSpan/4)) * time.Microsecond)
		case r < 110:
			time.Sleep(time.Duration(rng.Int64N(3*shortSpan)) * time.Microsecond)
		}
		if rng.IntN(10) < 3 && len(open) > 0 {
			j := rng.IntN(len(open))
			res := open[j]
			open = append(open[:j], open[j+1:]...)
			if rng.IntN(8) == 0 {
				res.n, res.at = 0, 0 // a charge with no reservation before it
			}
			actual := drawActual(rng, res)
			got, at, err := target.SettleAt(ctx, store, res.key, res.limit, res.at, res.n, actual)
			if err != nil {
				tb.Fatalf("step %d: settle: %v", i, err)
			}
			expired += expiredAt(oracle, res.key, res.limit, at)
			want, _, werr := oracle.SettleN(res.key, res.limit, res.at, res.n, actual, at)
			line := fmt.Sprintf("at %d settle (reserved %d at %d, actual %d) %v", at, res.n, res.at, actual, res.limit)
			history[res.key] = record(history[res.key], line, got, nil)
			if werr != nil || got != want {
				tb.Fatalf("step %d: store and model differ (model error %v):\n%s\nmodel: %s", i, werr, strings.Join(history[res.key], "\n"), show(want))
			}
			gen.Saw(got)
			continue
		}
		got, at, err := store.ReserveN(ctx, key, c.Limit, c.N)
		if c.N < 0 || int64(c.N) > model.Capacity(c.Limit) {
			if !errCost(err) {
				tb.Fatalf("step %d: cost %d under %v: the store says %s, %v, want the cost refused", i, c.N, c.Limit, show(got), err)
			}
			continue
		}
		if err != nil {
			tb.Fatalf("step %d: %v", i, err)
		}
		expired += expiredAt(oracle, key, c.Limit, at)
		want, werr := oracle.AllowN(key, c.Limit, c.N, at)
		history[key] = record(history[key], fmt.Sprintf("at %d reserve %d %v", at, c.N, c.Limit), got, nil)
		if werr != nil || got != want {
			tb.Fatalf("step %d: store and model differ (model error %v):\n%s\nmodel: %s", i, werr, strings.Join(history[key], "\n"), show(want))
		}
		if got.Allowed && c.N > 0 {
			open = append(open, reservationMade{key, c.Limit, at, c.N})
			if len(open) > 64 {
				open = open[1:]
			}
		}
		gen.Saw(got)
	}
}

// expiredAt returns 1 if the model holds key's state under l and it has
// expired at now, else 0.
func expiredAt(m *model.Model, key string, l tollgate.Limit, now int64) int {
	if exp, held := m.Expiry(key, l); held && now >= exp {
		return 1
	}
	return 0
}
