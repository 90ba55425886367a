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

// A middleware that keeps its own memory for each request keeps a Values in
// it, so that writing the headers allocates only their values' string.
func ExampleValues_Write() {
	type requestState struct {
		// ... the rest of the middleware's per-request state
		headerValues headers.Values
	}
	st := new(requestState) // one allocation per request, made anyway
	h := http.Header{}
	st.headerValues.Write(h, headers.Draft, time.Now(), headers.Decision{Policy: "api", Result: tollgate.Result{
		Allowed: true, Limit: tollgate.PerMinute(100), Remaining: 99, ResetAfter: 600 * time.Millisecond,
	}})
	fmt.Println("RateLimit-Policy:", h.Get("RateLimit-Policy"))
	fmt.Println("RateLimit:", h.Get("RateLimit"))
	// Output:
	// RateLimit-Policy: "api";q=100;w=60
	// RateLimit: "api";r=99;t=1
}
