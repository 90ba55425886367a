package service

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// hungStore never answers: each call waits for its context, and records
// when it was made and the deadline it was given.
type hungStore struct{ calls chan [2]time.Time }

func (s hungStore) AllowN(ctx context.Context, _ string, _ tollgate.Limit, _ int) (tollgate.Result, error) {
	at := time.Now()
	dl, _ := ctx.Deadline()
	s.calls <- [2]time.Time{at, dl}
	<-ctx.Done()
	return tollgate.Result{}, ctx.Err()
}

func (hungStore) Reset(context.Context, string, tollgate.Limit) error { return nil }

// TestCallerDeadlineReserve: a caller's deadline sooner than the service's
// timeout bounds the store call, less a reserve for the answer's way back
// of half the time the caller has left, at most 10 ms: with a 20 ms
// deadline the store gets 10 ms, and the answer 10 — a quarter (5 ms) was
// too little on a machine short of CPU, where waking up after the store's
// deadline took longer than that.
func TestCallerDeadlineReserve(t *testing.T) {
	t.Parallel()
	rules, err := config.Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	reserve := func(left time.Duration) time.Duration { return min(left/2, 10*time.Millisecond) }
	for _, caller := range []time.Duration{12 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond} {
		store := hungStore{calls: make(chan [2]time.Time, 1)}
		s, err := New(store, WithTimeout(time.Second), WithLogger(slog.New(&testkit.Logs{})))
		if err != nil {
			t.Fatal(err)
		}
		s.SetRules(rules)
		ctx, cancel := context.WithTimeout(context.Background(), caller)
		start := time.Now()
		callerDL, _ := ctx.Deadline()
		resp, err := s.ShouldRateLimit(ctx, req("d", entries("k", "v")))
		cancel()
		if err != nil || codesOf(resp) != "OK: OK" {
			t.Fatalf("caller deadline %v: %v, %v; want OK by failure mode", caller, codesOf(resp), err)
		}
		call := <-store.calls
		// The reserve is worked out between start and the store call,
		// from what the caller has left then (give or take a few
		// microseconds of rounding).
		const slack = 50 * time.Microsecond
		got, most, least := callerDL.Sub(call[1]), reserve(callerDL.Sub(start))+slack, reserve(callerDL.Sub(call[0]))-slack
		if got > most || got < least {
			t.Errorf("caller deadline %v: the store call ends %v before it, want half the time left, at most 10 ms: %v to %v", caller, got, least, most)
		}
	}
}
