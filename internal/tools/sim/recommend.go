package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

// The tuning rule: a refill rate slightly above
// the client's sustained p99 requests per second, so normal use never meets
// the limit, and a bucket that absorbs 5 to 10 seconds of that p99, for a
// batch job's retry or a page's burst of calls.
const (
	minBurstS = 5    // seconds of p99 in the bucket, at least
	maxBurstS = 10   // and at most
	target    = 0.99 // the share of requests the limit must let through
)

// rateAbove is "slightly above" p99 requests a second: p99 + 10%, rounded
// up to a whole request, at least 1. It is computed in integers: in
// floating point 100 × 1.1 is 110.00000000000001, which rounds up to 111.
func rateAbove(p99 int) int { return max(1, (11*p99+9)/10) }

// Recommendation is a token-bucket limit suggested for one client's traffic.
type Recommendation struct {
	// Requests and Span describe the traffic.
	Requests int
	Span     time.Duration
	// P50, P95, P99 and Max are the client's requests per second, over
	// every second of Span (idle ones included).
	P50, P95, P99, Max int
	// Limit is the suggestion: a token bucket of Limit.Rate per second,
	// Burst tokens, which is BurstSeconds of P99.
	Limit        tollgate.Limit
	BurstSeconds int
	// Admitted is the share of the traffic's requests that Limit admits
	// (simulated): at least 0.99 unless Met is false.
	Admitted float64
	Met      bool
}

// Recommend suggests a token bucket for tr, by the rule above: a rate of
// p99 + 10% per second, and the smallest burst of 5 to 10 seconds of p99
// that, simulated over tr, admits at least 99% of its requests. When even
// 10 seconds does not, it says so (Met is false): the traffic's peaks are
// longer than a bucket should absorb, and the rate itself must rise.
func Recommend(tr Traffic) (Recommendation, error) {
	rec := Recommendation{Requests: len(tr.Times), Span: tr.Span}
	if len(tr.Times) == 0 {
		return rec, fmt.Errorf("sim: recommend: %s has no requests", tr.Name)
	}
	seconds := int64((tr.Span + time.Second - 1) / time.Second) // up to 3e9: int64 on 32-bit platforms too
	busy := busySeconds(tr.Times)
	q := func(p float64) int { // nearest rank, over every second
		i := max(int64(math.Ceil(p*float64(seconds)))-1, 0) - (seconds - int64(len(busy)))
		if i < 0 {
			return 0 // an idle second
		}
		return busy[i]
	}
	rec.P50, rec.P95, rec.P99, rec.Max = q(0.50), q(0.95), q(0.99), busy[len(busy)-1]

	rate := rateAbove(rec.P99)
	for s := minBurstS; s <= maxBurstS; s++ {
		l := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: rate, Period: time.Second, Burst: max(1, rec.P99*s)}
		admitted, err := admittedShare(tr, l)
		if err != nil {
			return rec, err
		}
		rec.Limit, rec.BurstSeconds, rec.Admitted = l, s, admitted
		if admitted >= target {
			rec.Met = true
			break
		}
	}
	return rec, nil
}

// busySeconds returns the count of requests in each second that has any,
// sorted: as many counts as requests at most, however long the traffic.
// times must be sorted.
func busySeconds(times []time.Duration) []int {
	var counts []int
	for i := 0; i < len(times); {
		s, n := times[i]/time.Second, 0
		for ; i < len(times) && times[i]/time.Second == s; i++ {
			n++
		}
		counts = append(counts, n)
	}
	slices.Sort(counts)
	return counts
}

// admittedShare simulates tr through a token bucket of l.
func admittedShare(tr Traffic, l tollgate.Limit) (float64, error) {
	var now time.Time
	s := memorystore.New(memorystore.WithClock(func() time.Time { return now }), memorystore.WithShards(1))
	admitted := 0
	for _, at := range tr.Times {
		now = base.Add(at)
		res, err := s.AllowN(context.Background(), "client", l, 1)
		if err != nil {
			return 0, fmt.Errorf("sim: recommend: %w", err)
		}
		if res.Allowed {
			admitted++
		}
	}
	return float64(admitted) / float64(len(tr.Times)), nil
}

// Write prints the recommendation for people.
func (r Recommendation) Write(w io.Writer) error {
	_, err := fmt.Fprintf(w, `Traffic: %d requests over %v. Requests per second: p50 %d, p95 %d, p99 %d, max %d.
Recommended: a token bucket of %d/s (p99 + 10%%), burst %d (%d s of p99): it admits %.2f%% of these requests%s.
  tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: %d, Period: time.Second, Burst: %d}
`, r.Requests, r.Span.Round(time.Millisecond), r.P50, r.P95, r.P99, r.Max,
		r.Limit.Rate, r.Limit.Burst, r.BurstSeconds, 100*r.Admitted, metText(r.Met),
		r.Limit.Rate, r.Limit.Burst)
	return err
}

func metText(met bool) string {
	if met {
		return ""
	}
	return "; less than 99% even with 10 s of burst: this client's peaks last longer than a bucket should absorb, so raise the rate, not the burst"
}
