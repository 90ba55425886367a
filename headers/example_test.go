package headers_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
)

// A request checked against two policies: the per-second burst denied it.
func ExampleWrite() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ds := []headers.Decision{
		{Policy: "burst", Result: tollgate.Result{
			Limit: tollgate.PerSecond(10), Remaining: 0, RetryAfter: 1200 * time.Millisecond, ResetAfter: time.Second,
		}},
		{Policy: "daily", Result: tollgate.Result{
			Allowed: true, Limit: tollgate.PerDay(10000), Remaining: 9500, ResetAfter: 5 * time.Hour,
		}},
	}
	h := http.Header{}
	headers.Write(h, headers.Draft|headers.XRateLimit, now, ds...)
	for _, f := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
		fmt.Printf("%s: %s\n", f, h.Get(f))
	}
	// Output:
	// RateLimit-Policy: "burst";q=10;w=1, "daily";q=10000;w=86400
	// RateLimit: "burst";r=0;t=2, "daily";r=9500;t=18000
	// X-RateLimit-Limit: 10
	// X-RateLimit-Remaining: 0
	// X-RateLimit-Reset: 1767268802
	// Retry-After: 2
}
