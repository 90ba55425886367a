package memorystore_test

import (
	"context"
	"flag"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
)

// go test ./memorystore/ -run TestModelLong -steps=1000000 runs a million
// random calls per algorithm against the reference model; -steps scales
// TestSettleModel (half) and TestModelRealTime (a tenth) too. The default
// is short enough for every test run.
var (
	modelSteps = flag.Int("steps", 10000, "random calls per algorithm in the model tests (TestModelLong and others)")
	modelSeed  = flag.Uint64("seed", 1, "seed of the model tests' calls (0: a new one each run)")
)

// modelTarget checks the memory store against the model, and its state's
// expiry: the model's, to the microsecond (both run on the test's clock).
// A state the model has forgotten may still be held, expired, until the
// store reclaims it: the differentials delete some with Reset and reclaim
// the rest now and then (Sweep), where the store would as new keys arrive.
//
// The store is made too large to evict a live key, which forgets what it
// spent and so changes decisions.
func modelTarget() conformance.ModelTarget {
	return conformance.ModelTarget{
		New: func(tb testing.TB, now func() time.Time) tollgate.Store {
			return memorystore.New(memorystore.WithClock(now), memorystore.WithMaxKeys(1<<28))
		},
		Sweep: func(tb testing.TB, s tollgate.Store) { s.(*memorystore.Store).Sweep() },
		After: func(tb testing.TB, s tollgate.Store, key string, l tollgate.Limit, r tollgate.Result, wrote bool, before any, exp conformance.Expiry) bool {
			tb.Helper()
			ms := s.(*memorystore.Store)
			got, ok := ms.TTL(key, l)
			switch {
			case exp.Held && (!ok || got != ms.Until(exp.At)):
				tb.Fatalf("the state expires in %v (held: %v), want %v (the model's, after ResetAfter %v)", got, ok, ms.Until(exp.At), r.ResetAfter)
			case !exp.Held && ok && got > 0:
				tb.Fatalf("the state expires in %v, want it expired (the model holds none)", got)
			}
			return false
		},
	}
}

func seed(t *testing.T) uint64 {
	s := *modelSeed
	if s == 0 {
		s = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -seed=%d)", s, s)
	return s
}

func TestModelLong(t *testing.T) {
	s := seed(t)
	for _, alg := range tollgate.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			conformance.ModelDifferential(t, modelTarget(), alg, rand.NewPCG(s, uint64(alg)), *modelSteps)
		})
	}
}

func fuzzModel(f *testing.F, alg tollgate.Algorithm) {
	f.Fuzz(func(t *testing.T, data []byte) {
		conformance.ModelDifferential(t, modelTarget(), alg, conformance.NewByteSource(data), 500)
	})
}

func FuzzTokenBucket(f *testing.F)          { fuzzModel(f, tollgate.TokenBucket) }
func FuzzGCRA(f *testing.F)                 { fuzzModel(f, tollgate.GCRA) }
func FuzzFixedWindow(f *testing.F)          { fuzzModel(f, tollgate.FixedWindow) }
func FuzzSlidingWindowLog(f *testing.F)     { fuzzModel(f, tollgate.SlidingWindowLog) }
func FuzzSlidingWindowCounter(f *testing.F) { fuzzModel(f, tollgate.SlidingWindowCounter) }
func FuzzLeakyBucket(f *testing.F)          { fuzzModel(f, tollgate.LeakyBucket) }

// FuzzSettle: reservations, settles and refunds of the algorithm the first
// byte picks, the rest drawing the calls, against the model.
func FuzzSettle(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		alg := tollgate.Algorithms()[int(data[0])%len(tollgate.Algorithms())]
		conformance.SettleDifferential(t, modelTarget(), alg, conformance.NewByteSource(data[1:]), 300)
	})
}

// FuzzEnds: decisions at the corners of the input space (both ends of the
// clock, rate changes that keep a bucket's unit, amounts near 2^53), of the
// algorithm the first byte picks, against the model.
func FuzzEnds(f *testing.F) {
	f.Add([]byte{5, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		alg := tollgate.Algorithms()[int(data[0])%len(tollgate.Algorithms())]
		conformance.ModelEnds(t, modelTarget(), alg, conformance.NewByteSource(data[1:]), 300)
	})
}

// clockedStore is a memory store that remembers the time it last read, the
// time of its last call.
type clockedStore struct {
	*memorystore.Store
	last atomic.Int64
}

// TestModelRealTime: decisions, reservations and settles on the store's
// clock, in real time, its state expiring as time passes, against the model
// at the instant of each call.
func TestModelRealTime(t *testing.T) {
	s := seed(t)
	target := conformance.RealTimeTarget{
		New: func(tb testing.TB) tollgate.Settler {
			cs := &clockedStore{}
			cs.Store = memorystore.New(memorystore.WithClock(func() time.Time {
				at := time.Now()
				cs.last.Store(at.UnixMicro())
				return at
			}))
			return cs
		},
		SettleAt: func(ctx context.Context, s tollgate.Settler, key string, l tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, int64, error) {
			cs := s.(*clockedStore)
			r, err := cs.SettleN(ctx, key, l, at, reserved, actual)
			return r, cs.last.Load(), err
		},
	}
	for _, alg := range tollgate.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			conformance.ModelRealTime(t, target, alg, rand.NewPCG(s, uint64(alg)), *modelSteps/10)
		})
	}
}

func TestModelCases(t *testing.T) {
	conformance.RunModelCases(t, modelTarget())
}

// TestSettleModel: reservations and their settles, against the model.
func TestSettleModel(t *testing.T) {
	conformance.SettleModel(t, modelTarget(), *modelSteps/2, seed(t))
}

// TestModelCalendar: calendar windows against the model, across Berlin's
// DST changes of 2027 and the Februaries of 2027 and 2028.
func TestModelCalendar(t *testing.T) {
	s := seed(t)
	for _, alg := range []tollgate.Algorithm{tollgate.FixedWindow, tollgate.SlidingWindowCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			conformance.ModelCalendar(t, modelTarget(), alg, rand.NewPCG(s, 0xca1+uint64(alg)), *modelSteps)
		})
	}
}
