package redisstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
)

// TestScriptArgs: a decision's script arguments are the limit's, n and now
// in their places, for limits of every algorithm, many more than there are
// templates, asked in turns (limits that share a slot included), and a
// slot once taken keeps its limit.
func TestScriptArgs(t *testing.T) {
	want := func(p tollgate.Params, n int, now string) []any {
		switch p.Algorithm {
		case tollgate.TokenBucket:
			return []any{p.UnitRate, p.Unit, p.Burst, n, now, p.MaxDebt}
		case tollgate.LeakyBucket:
			return []any{p.UnitRate, p.Unit, p.Burst, n, now, p.MaxDelayUS}
		case tollgate.GCRA:
			return []any{p.UnitRate, p.Unit, p.Burst, n, now}
		case tollgate.SlidingWindowCounter:
			return []any{p.Rate, p.PeriodUS, exact.SlidingGrain(p.PeriodUS), n, now}
		default:
			return []any{p.Rate, p.PeriodUS, n, now}
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var params []tollgate.Params
	for len(params) < 500 {
		l := tollgate.Limit{
			Rate:      1 + rng.IntN(5000),
			Period:    time.Duration(1+rng.IntN(3600)) * time.Second,
			Burst:     1 + rng.IntN(5000),
			Algorithm: tollgate.Algorithm(rng.IntN(6)),
		}
		if l.Algorithm == tollgate.LeakyBucket && rng.IntN(2) == 0 {
			l.MaxDelay = time.Duration(rng.IntN(10)) * time.Second
		}
		p, err := l.Params()
		if err != nil {
			continue
		}
		params = append(params, p)
	}
	for round := range 3 {
		for i, p := range params {
			n, now := i%7, fmt.Sprint(round*1000+i)
			if i%2 == 0 {
				now = ""
			}
			if got, want := fmt.Sprint(scriptArgs(p, n, now)), fmt.Sprint(want(p, n, now)); got != want {
				t.Fatalf("round %d, %+v: arguments %s, want %s", round, p, got, want)
			}
		}
	}
	// A template's arguments are never the ones a call filled in.
	for i := range argTemplates {
		if tm := argTemplates[i].Load(); tm != nil && (tm.args[tm.key.at] != nil || tm.args[tm.key.at+1] != nil) {
			t.Fatalf("template %d holds a call's n and now: %v", i, tm.args)
		}
	}
}
