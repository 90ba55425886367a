package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// TestServeCallerDeadline pauses Redis under a service running with the
// default --timeout (50 ms) and asks it with a 20 ms gRPC deadline: the
// caller's sooner deadline bounds the store call, so the rule's failure mode
// (open) answers OK before the caller gives up, instead of the answer
// arriving after it did.
func TestServeCallerDeadline(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000, failure_mode: open}\n")
	p := startTollgate(t, "serve", "--config", path, "--redis", rdb.URL())
	req := request("d", desc("k", randomID()))
	p.ask(req) // connects the client and the store's pool while Redis answers

	if err := rdb.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rdb.Resume(); err != nil {
			t.Error(err)
		}
	})

	// Every call should be answered; a loaded machine may make a few miss
	// their 20 ms, so a clear majority is asked for. A service that waits
	// for its own 50 ms answers none of them in time.
	const calls, want = 20, 14
	answered := 0
	for range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		resp, err := p.rls.ShouldRateLimit(ctx, req)
		cancel()
		switch {
		case err == nil:
			answered++
			if got, want := codesOf(resp), "OK: OK"; got != want {
				t.Errorf("answer %s, want %s (failure_mode open)", got, want)
			}
		case status.Code(err) == codes.DeadlineExceeded:
		default:
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d of %d calls with a 20 ms deadline answered in time", answered, calls)
	if answered < want {
		t.Errorf("%d of %d calls with a 20 ms deadline answered in time, want at least %d", answered, calls, want)
	}
}
