package service

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/redisstore"
)

// TestFailClosedRetryAfter: with Redis stopped, a request turned away
// because a rule failed closed says when to come back — a second unless
// WithFailClosedRetryAfter says otherwise, or the longer wait of a denial
// in the same request — except where no Retry-After is sent at all
// (envoy compatibility, no header fields) or the request passes anyway.
func TestFailClosedRetryAfter(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	client := rdb.Client(t)
	if err := rdb.Stop(); err != nil {
		t.Fatal(err)
	}
	rules, err := config.Parse("rules.yaml", []byte(`domain: d
descriptors:
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 10, failure_mode: closed}
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: none
    rate_limit: {unit: minute, requests_per_unit: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a minute's start: "none" waits 60 s
	tests := []struct {
		name string
		opts []Option
		keys []string
		want string
	}{
		{"default", nil, []string{"closed"}, `OVER_LIMIT [OVER_LIMIT r=0 t=1s] Retry-After: 1;`},
		{"option", []Option{WithFailClosedRetryAfter(2500 * time.Millisecond)}, []string{"closed"}, `OVER_LIMIT [OVER_LIMIT r=0 t=3s] Retry-After: 3;`},
		{"fail open", nil, []string{"open"}, `OK [OK r=0]`},
		{"and a longer denial", nil, []string{"closed", "none"},
			`OVER_LIMIT [OVER_LIMIT r=0 t=1s] [OVER_LIMIT r=0 t=60s] RateLimit-Policy: "d.none";q=0;w=0; RateLimit: "d.none";r=0;t=60; Retry-After: 60;`},
		{"envoy", []Option{WithEnvoyCompat(true)}, []string{"closed"}, `OVER_LIMIT [OVER_LIMIT r=0 t=1s]`},
		{"no header fields", []Option{WithHeaders(0)}, []string{"closed"}, `OVER_LIMIT [OVER_LIMIT r=0 t=1s]`},
		{"global dry run", []Option{WithDryRun(true)}, []string{"closed"}, `OK [OVER_LIMIT r=0 t=1s]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := testkit.NewClock(t0)
			opts := append([]Option{WithClock(clock.Now), WithTimeout(time.Second), WithLogger(slog.New(&testkit.Logs{}))}, tc.opts...)
			s, err := New(redisstore.New(client), opts...)
			if err != nil {
				t.Fatal(err)
			}
			s.SetRules(rules)
			r := req("d")
			for _, k := range tc.keys {
				r.Descriptors = append(r.Descriptors, req("d", entries(k, "v")).Descriptors...)
			}
			if got := replyText(ask(t, s, r)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
