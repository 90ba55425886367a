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
// GCRA, at every rate — its theoretical arrival time keeps the fraction of a
// µs that Period/Rate leaves, in the token bucket's units. The same random
// calls go to all three, on keys of their own, for rates whose interval is a
// whole number of µs, a third of one, and half a µs. The clock only moves
// forward here: when it goes backwards a token bucket lets a key spend the
// tokens it still has, while GCRA, which keeps no time of last update,
// counts the lag against it — both never reward the jump, but they are not
// equal then. Nor are they after a rate change: the token bucket keeps its
// tokens, GCRA its time until full.
func Equivalences(t *testing.T, b Backend, steps int, seed uint64) {
	clock := NewClock()
	s := b.New(t, clock.Now)
	rng := rand.New(rand.NewPCG(seed, seed+1))
	ctx := context.Background()
	key := fmt.Sprintf("equiv:%d", rand.Int64())
	bases := []struct {
		limit tollgate.Limit
		step  int // the largest clock step, µs
	}{
		{tollgate.Limit{Rate: 4, Period: time.Second, Burst: 6}, 400_000},                 // 250ms per token
		{tollgate.Limit{Rate: 3, Period: time.Second, Burst: 5}, 500_000},                 // 333,333⅓µs
		{tollgate.Limit{Rate: 7, Period: 3 * time.Second, Burst: 2}, 900_000},             // 428,571³⁄₇µs
		{tollgate.Limit{Rate: 2_000_000, Period: time.Second, Burst: 2_000_000}, 400_000}, // ½µs
		{tollgate.Limit{Rate: 999_983, Period: time.Minute, Burst: 1000}, 50_000},
	}
	var now time.Duration
	for i := 0; i < steps; i++ {
		base := bases[i%len(bases)]
		now += time.Duration(rng.IntN(base.step)) * time.Microsecond
		clock.Set(now)
		n := rng.IntN(base.limit.Burst + 1)
		if base.limit.Burst > 100 && rng.IntN(2) == 0 {
			n = rng.IntN(8) // small costs too, where fractions carry
		}
		var results [3]tollgate.Result
		for j, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.LeakyBucket, tollgate.GCRA} {
			l := base.limit
			l.Algorithm = a
			r, err := s.AllowN(ctx, fmt.Sprint(key, ":", i%len(bases)), l, n)
			if err != nil {
				t.Fatal(err)
			}
			r.Limit = tollgate.Limit{}
			results[j] = r
		}
		if results[1] != results[0] || results[2] != results[0] {
			t.Fatalf("step %d at T0%+v, %v, n %d:\ntoken bucket %+v\nleaky bucket %+v\ngcra         %+v", i, now, base.limit, n, results[0], results[1], results[2])
		}
	}
}
