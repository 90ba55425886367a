package sim_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/tools/sim"
)

// A boundary attack on a limit of 10 per second: 10 requests just before
// every other window edge and 10 just after. The fixed window lets 20
// through within 200 ms; the sliding window log never more than 10 in any
// second.
func ExampleRun() {
	l := tollgate.Limit{Rate: 10, Period: time.Second, Burst: 10}
	tr, err := sim.Pattern("boundary", l, 20*time.Second, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	rep, err := sim.Run(context.Background(), tr, sim.Config{Limit: l})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rep.Results {
		fmt.Printf("%-22s admitted %3d, most in any second %2d, over the limit %3d\n",
			r.Limit.Algorithm, r.Admitted, r.MaxInPeriod, r.Over)
	}
	// Output:
	// token_bucket           admitted 110, most in any second 11, over the limit  10
	// gcra                   admitted 110, most in any second 11, over the limit  10
	// fixed_window           admitted 200, most in any second 20, over the limit 100
	// sliding_window_log     admitted 100, most in any second 10, over the limit   0
	// sliding_window_counter admitted 100, most in any second 10, over the limit   0
	// leaky_bucket           admitted 110, most in any second 11, over the limit  10
}

// Recommend applies the tuning rule to a client that sends 20 requests a
// second and, for one second in every two minutes, 60: its p99 is 20, and
// a bucket of 5 s of it absorbs the peaks.
func ExampleRecommend() {
	var tr sim.Traffic
	for s := range 600 {
		n := 20
		if s%120 == 30 {
			n = 60
		}
		for i := range n {
			tr.Times = append(tr.Times, time.Duration(s)*time.Second+time.Duration(i)*time.Second/time.Duration(n))
		}
	}
	tr.Span = 600 * time.Second
	rec, err := sim.Recommend(tr)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = rec.Write(os.Stdout)
	// Output:
	// Traffic: 12200 requests over 10m0s. Requests per second: p50 20, p95 20, p99 20, max 60.
	// Recommended: a token bucket of 22/s (p99 + 10%), burst 100 (5 s of p99): it admits 100.00% of these requests.
	//   tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 22, Period: time.Second, Burst: 100}
}
