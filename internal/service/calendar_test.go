package service

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

const calendarRules = `
domain: billing
descriptors:
  - key: plan
    value: free
    rate_limit: {unit: month, requests_per_unit: 3, calendar: Europe/Berlin}
  - key: plan
    value: envoy
    rate_limit: {unit: month, requests_per_unit: 3}
  - key: plan
    value: closed
    rate_limit: {unit: day, requests_per_unit: 0, calendar: Europe/Berlin}
`

func newCalendarServer(t *testing.T, store func(clock func() time.Time) *Server, now time.Time) *Server {
	t.Helper()
	s := store(func() time.Time { return now })
	r, err := config.Parse("rules.yaml", []byte(calendarRules))
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(r)
	return s
}

// TestCalendarUntilReset: a calendar month's duration_until_reset runs to
// the month's end in its zone (18 days and 12 hours on 2027-02-10 at noon
// in Berlin, February having 28 days), where envoy's month (no calendar)
// is 30 days from the epoch; a calendar day of 0 requests denies until
// local midnight.
func TestCalendarUntilReset(t *testing.T) {
	t.Parallel()
	berlin, _ := time.LoadLocation("Europe/Berlin")
	now := time.Date(2027, 2, 10, 12, 0, 0, 0, berlin)
	s := newCalendarServer(t, func(clock func() time.Time) *Server {
		s, err := New(memorystore.New(memorystore.WithClock(clock)), WithClock(clock), WithHeaders(headers.Draft),
			WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, now)
	monthEnd := time.Date(2027, 3, 1, 0, 0, 0, 0, berlin).Sub(now) / time.Second
	epoch := 30 * 24 * time.Hour
	envoyEnd := (epoch - time.Duration(now.UnixNano())%epoch) / time.Second
	midnight := time.Date(2027, 2, 11, 0, 0, 0, 0, berlin).Sub(now) / time.Second
	for _, tc := range []struct {
		value string
		want  string
	}{
		{"free", "OK [OK r=2 t=" + itoa(int64(monthEnd)) + "s] RateLimit-Policy: \"billing.plan_free\";q=3;w=2678400; RateLimit: \"billing.plan_free\";r=2;t=" + itoa(int64(monthEnd)) + ";"},
		{"envoy", "OK [OK r=2 t=" + itoa(int64(envoyEnd)) + "s] RateLimit-Policy: \"billing.plan_envoy\";q=3;w=2592000; RateLimit: \"billing.plan_envoy\";r=2;t=" + itoa(int64(envoyEnd)) + ";"},
		{"closed", "OVER_LIMIT [OVER_LIMIT r=0 t=" + itoa(int64(midnight)) + "s]"},
	} {
		got := replyText(ask(t, s, req("billing", entries("plan", tc.value))))
		if tc.value == "closed" {
			got = got[:len(tc.want)] // its headers are another test's
		}
		if got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.value, got, tc.want)
		}
	}
	if monthEnd != 18*24*3600+12*3600 {
		t.Errorf("the month ends in %ds, want 18 days and 12 hours", monthEnd)
	}
}

// TestCalendarUntilResetRedis: on Redis, whose clock decides, the calendar
// month's duration_until_reset is the time from the server's now to the
// month's end in Berlin, rounded up to a second.
func TestCalendarUntilResetRedis(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t).Client(t)
	s := newCalendarServer(t, func(func() time.Time) *Server {
		s, err := New(redisstore.New(rdb), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, time.Time{})
	berlin, _ := time.LoadLocation("Europe/Berlin")
	before := time.Now()
	resp := ask(t, s, req("billing", entries("plan", "free")))
	after := time.Now()
	if resp.OverallCode != pb.RateLimitResponse_OK || len(resp.Statuses) != 1 {
		t.Fatalf("answer %s, want OK", replyText(resp))
	}
	end := func(t time.Time) time.Time {
		t = t.In(berlin)
		return time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, berlin)
	}
	ceil := func(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
	// Redis's TIME is read between before and after (within a minute of
	// this machine's clock, on loopback).
	lo := min(ceil(end(before).Sub(before.Add(time.Minute))), ceil(end(after).Sub(after.Add(time.Minute))))
	hi := max(ceil(end(before).Sub(before.Add(-time.Minute))), ceil(end(after).Sub(after.Add(-time.Minute))))
	if got := resp.Statuses[0].GetDurationUntilReset().GetSeconds(); got < lo || got > hi {
		t.Errorf("duration_until_reset %ds, want from %d to %d (to %v)", got, lo, hi, end(before))
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
