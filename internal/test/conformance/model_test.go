package conformance_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/model"
	"github.com/tollgate/tollgate/memorystore"
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

// TestModelEnds runs the memory store against the model at the corners
// NewEndsGen draws from, and checks that it reaches them: both ends of the
// clock, rate changes that keep a bucket's unit, and amounts near 2^53.
func TestModelEnds(t *testing.T) {
	t.Parallel()
	target := conformance.ModelTarget{New: func(tb testing.TB, now func() time.Time) tollgate.Store {
		return memorystore.New(memorystore.WithClock(now), memorystore.WithMaxKeys(1<<28))
	}}
	for _, alg := range tollgate.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			conformance.ModelEnds(t, target, alg, rand.NewPCG(7, uint64(alg)), 3000)

			g := conformance.NewEndsGen(alg, rand.NewPCG(8, uint64(alg)))
			var early, late, sameUnit, near53 int
			prev := g.Next()
			for range 3000 {
				c := g.Next()
				l := c.Limit
				switch {
				case c.Now < 366*24*3600*1_000_000:
					early++
				case c.Now > exact.MaxNow-366*24*3600*1_000_000:
					late++
				}
				p, _ := l.Params()
				q, _ := prev.Limit.Params()
				if l.Period == prev.Limit.Period && l.Rate != prev.Limit.Rate && p.Unit == q.Unit {
					sameUnit++
				}
				if p.Unit > 0 && (p.Capacity+p.MaxDebt)*p.Unit > exact.Max/2 {
					near53++
				}
				prev = c
			}
			t.Logf("1970: %d, 2250: %d, same unit: %d, above 2^52: %d", early, late, sameUnit, near53)
			bucket := alg == tollgate.TokenBucket || alg == tollgate.GCRA || alg == tollgate.LeakyBucket
			for _, check := range []struct {
				what string
				ok   bool
			}{
				{"1970", early > 100},
				{"exact.MaxNow", late > 100},
				{"a rate change that keeps the unit", !bucket || sameUnit > 10},
				{"amounts above 2^52", !bucket || near53 > 100},
			} {
				if !check.ok {
					t.Errorf("3,000 calls never reach %s", check.what)
				}
			}
		})
	}
}
