package service

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/redisstore"
)

// TestFailureLogSampled: with Redis stopped, store failures are logged at
// most once per log interval (the middleware's default unless
// WithLogInterval says otherwise), each record saying in
// similar_events_not_logged how many were left out.
func TestFailureLogSampled(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	client := rdb.Client(t)
	if err := rdb.Stop(); err != nil {
		t.Fatal(err)
	}
	rules, err := config.Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		opts        []Option
		wantRecords int
		wantSkipped []int64 // per record
	}{
		{name: "default interval", wantRecords: 2, wantSkipped: []int64{0, 5}},
		{name: "every failure", opts: []Option{WithLogInterval(0)}, wantRecords: 7, wantSkipped: []int64{0, 0, 0, 0, 0, 0, 0}},
		{name: "an hour", opts: []Option{WithLogInterval(time.Hour)}, wantRecords: 1, wantSkipped: []int64{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &testkit.Logs{}
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clock := testkit.NewClock(t0)
			opts := append([]Option{WithClock(clock.Now), WithLogger(slog.New(logs))}, tc.opts...)
			s, err := New(redisstore.New(client), opts...)
			if err != nil {
				t.Fatal(err)
			}
			s.SetRules(rules)
			for range 5 {
				if got, want := codesOf(ask(t, s, req("d", entries("k", "v")))), "OK: OK"; got != want {
					t.Fatalf("Redis down: %s, want %s (fail open)", got, want)
				}
			}
			// 2 s later, then 11 s after the first: within the default
			// interval, then past it.
			for _, at := range []time.Duration{2 * time.Second, enforce.DefaultLogInterval + time.Second} {
				clock.Set(t0.Add(at))
				ask(t, s, req("d", entries("k", "v")))
			}

			recs := logs.Records()
			if got, want := len(recs), tc.wantRecords; got != want {
				t.Fatalf("%d records, want %d", got, want)
			}
			for i, rec := range recs {
				got := int64(-1)
				rec.Attrs(func(a slog.Attr) bool {
					if a.Key == engine.SkippedKey {
						got = a.Value.Int64()
					}
					return true
				})
				if want := tc.wantSkipped[i]; got != want {
					t.Errorf("record %d: %s = %d, want %d", i, engine.SkippedKey, got, want)
				}
			}
		})
	}
}
