package conformance_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/conformance"
	"github.com/tollgate/tollgate/internal/model"
)

// The oracle passes the hand-computed table every store must pass.
func TestModelConformance(t *testing.T) {
	conformance.Run(t, conformance.ModelBackend())
}

// TestGenCoversTheSpace checks that the generator reaches the corners of
// the input space it promises, with valid limits only, and that the model's
// Capacity is the limit's.
func TestGenCoversTheSpace(t *testing.T) {
	t.Parallel()
	for _, alg := range tollgate.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			g := conformance.NewGen(alg, rand.NewPCG(1, uint64(alg)))
			var (
				minRate, maxRate     = 1 << 62, 0
				minPeriod, maxPeriod = time.Duration(1 << 62), time.Duration(0)
				peeks, full, over    int
				frozen, back, ahead  int
				changes, shaping     int
				lowDebt              int
				prev                 conformance.Call
			)
			for i := 0; i < 20_000; i++ {
				c := g.Next()
				l := c.Limit
				if err := l.Validate(); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if got, want := model.Capacity(l), int64(l.Capacity()); got != want {
					t.Fatalf("%v: model capacity %d, Limit.Capacity %d", l, got, want)
				}
				if p, _ := l.Params(); model.MaxDebt(l) != p.MaxDebt {
					t.Fatalf("%v: model MaxDebt %d, Params.MaxDebt %d", l, model.MaxDebt(l), p.MaxDebt)
				}
				if model.MaxDebt(l) < model.Capacity(l) {
					lowDebt++ // a debt 2^53 bounds
				}
				minRate, maxRate = min(minRate, l.Rate), max(maxRate, l.Rate)
				minPeriod, maxPeriod = min(minPeriod, l.Period), max(maxPeriod, l.Period)
				switch {
				case c.N == 0:
					peeks++
				case c.N == l.Capacity():
					full++
				case c.N > l.Capacity():
					over++
				}
				if i > 0 {
					switch {
					case c.Now == prev.Now:
						frozen++
					case c.Now < prev.Now:
						back++
					default:
						ahead++
					}
					if l.Period == prev.Limit.Period && l != prev.Limit {
						changes++
					}
				}
				if l.MaxDelay > 0 {
					shaping++
				}
				prev = c
			}
			wantMax := 10_000_000
			if alg == tollgate.SlidingWindowLog {
				wantMax = conformance.MaxLogRate
			}
			for _, check := range []struct {
				what string
				ok   bool
			}{
				{"rate 1", minRate == 1},
				{"the largest rate", maxRate == wantMax},
				{"a 1µs period", minPeriod == time.Microsecond},
				{"a year's period", maxPeriod >= 365*24*time.Hour},
				{"peeks", peeks > 100},
				{"the full capacity", full > 100},
				{"costs above capacity", over > 10},
				{"a frozen clock", frozen > 1000},
				{"steps back", back > 1000},
				{"steps forward", ahead > 1000},
				{"limit changes on a live period", changes > 100},
				{"shaping", alg != tollgate.LeakyBucket || shaping > 1000},
				{"a MaxDebt below the capacity", alg == tollgate.FixedWindow || alg == tollgate.SlidingWindowLog || lowDebt > 100},
			} {
				if !check.ok {
					t.Errorf("20,000 calls never reach %s", check.what)
				}
			}
		})
	}
}
