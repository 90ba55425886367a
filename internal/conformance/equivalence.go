package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// Equivalences checks, on the store b makes, the identities between
// algorithms that follow from their definitions: a policing leaky bucket
// decides exactly as a token bucket of the same rate and burst, and so does
// GCRA when period/rate is a whole number of microseconds. The same random
// calls go to all three, on keys of their own. The clock only moves forward
// here: when it goes backwards a token bucket lets a key spend the tokens it
// still has, while GCRA, which keeps no time of last update, counts the lag
// against it — both never reward the jump, but they are not equal then.
func Equivalences(t *testing.T, b Backend, steps int, seed uint64) {
	clock := NewClock()
	s := b.New(t, clock.Now)
	rng := rand.New(rand.NewPCG(seed, seed+1))
	ctx := context.Background()
	key := fmt.Sprintf("equiv:%d", rand.Int64())
	base := tollgate.Limit{Rate: 4, Period: time.Second, Burst: 6} // 250ms per token
	var now time.Duration
	for i := 0; i < steps; i++ {
		now += time.Duration(rng.IntN(400_000)) * time.Microsecond
		clock.Set(now)
		n := rng.IntN(base.Burst + 1)
		var results [3]tollgate.Result
		for j, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.LeakyBucket, tollgate.GCRA} {
			l := base
			l.Algorithm = a
			r, err := s.AllowN(ctx, key, l, n)
			if err != nil {
				t.Fatal(err)
			}
			r.Limit = tollgate.Limit{}
			results[j] = r
		}
		if results[1] != results[0] || results[2] != results[0] {
			t.Fatalf("step %d at T0%+v, n %d:\ntoken bucket %+v\nleaky bucket %+v\ngcra         %+v", i, now, n, results[0], results[1], results[2])
		}
	}
}
