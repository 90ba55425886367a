package retry_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/retry"
)

// An outside provider allows 100 requests a minute across all our pods.
// Every pod waits on the same key of a shared store (redisstore in
// production; the memory store here) before sending, and retries what the
// provider still rate-limits after the wait it asks for.
func Example_outboundProviderQuota() {
	var calls atomic.Int32
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0") // busy: come back now
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer provider.Close()

	lim := tollgate.New(memorystore.New())
	client := &http.Client{Transport: retry.NewTransport(
		retry.NewOutbound(http.DefaultTransport, lim, "provider:acme", tollgate.PerMinute(100)),
	)}
	resp, err := client.Get(provider.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", calls.Load(), "attempts")
	// Output: 200 after 2 attempts
}
