package model_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/model"
)

const (
	us = time.Microsecond
	t0 = int64(1_767_225_600_000_000) // 2026-01-01T00:00:00Z in µs
)

type call struct {
	at    time.Duration
	limit tollgate.Limit
	n     int
	want  tollgate.Result // Limit is filled in
}

func allowed(remaining int, reset, delay time.Duration) tollgate.Result {
	return tollgate.Result{Allowed: true, Remaining: remaining, ResetAfter: reset, Delay: delay}
}

func denied(remaining int, retry, reset time.Duration) tollgate.Result {
	return tollgate.Result{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

// The expected values are worked out by hand from the definitions.
func TestModel(t *testing.T) {
	gcra3 := tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 3, Period: time.Second, Burst: 3}
	gcra2 := gcra3
	gcra2.Rate = 2
	shaper := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: time.Second, Burst: 1, MaxDelay: time.Second}
	swc := tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 10, Period: 2 * us}
	swl := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 2, Period: 100 * us}
	fw := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: time.Second}
	fwLow := fw
	fwLow.Rate = 1
	lbHigh := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10_000_000, Period: 24 * time.Hour, Burst: 1_000_000_000}
	lbLow := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: 24 * time.Hour, Burst: 1}
	tb := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 2, Period: time.Second, Burst: 2}
	for _, tc := range []struct {
		name  string
		calls []call
	}{
		{"GCRA's interval is exactly a third of a second", []call{
			{0, gcra3, 3, allowed(0, time.Second, 0)},
			// next = 1s + 333,333⅓µs, tolerance 1s: ⌈333,333⅓⌉.
			{0, gcra3, 1, denied(0, 333_334*us, time.Second)},
		}},
		{"GCRA's arrival time rounds up to the new unit", []call{
			{0, gcra3, 1, allowed(2, 333_334*us, 0)}, // TAT 333,333⅓µs
			// At 2/s the unit is 1µs: TAT 333,334µs; 3 − 333,334/500,000 = 2.33.
			{0, gcra2, 0, allowed(2, 333_334*us, 0)},
		}},
		{"token bucket", []call{
			{0, tb, 2, allowed(0, time.Second, 0)},
			{0, tb, 0, allowed(0, time.Second, 0)},
			{250 * time.Millisecond, tb, 1, denied(0, 250*time.Millisecond, 750*time.Millisecond)},
			// A step back: no refill, the lag added to every duration.
			{-time.Second, tb, 1, denied(0, 1500*time.Millisecond, 2*time.Second)},
		}},
		{"shaper: the lag counts against MaxDelay", []call{
			{time.Second, shaper, 1, allowed(0, time.Second, 0)},
			// Level 1 at 1s, seen from 0.5s: 0.5s lag + 1s to drain one.
			{time.Second / 2, shaper, 1, denied(0, time.Second/2, 1500*time.Millisecond)},
			{time.Second, shaper, 1, allowed(0, 2*time.Second, time.Second)},
			// A peek reports, and has nothing to delay.
			{time.Second, shaper, 0, allowed(0, 2*time.Second, 0)},
		}},
		{"leaky bucket level clamped after the rate fell", []call{
			{0, lbHigh, 1_000_000_000, allowed(0, 100*24*time.Hour, 0)},
			{0, lbLow, 1, denied(0, 24*time.Hour, 24*time.Hour)},
		}},
		{"sliding counter retries in the next window", []call{
			{0, swc, 10, allowed(0, 4*us, 0)},
			{3 * us, swc, 2, allowed(3, 3*us, 0)}, // 10×1 + 2×2 = 14 of 20
			{3 * us, swc, 4, denied(3, 1*us, 3*us)},
		}},
		{"sliding log: a peek later does not forget", []call{
			{100 * us, swl, 1, allowed(1, 100*us, 0)},
			{150 * us, swl, 1, allowed(0, 100*us, 0)},
			{205 * us, swl, 0, allowed(1, 45*us, 0)},
			{160 * us, swl, 1, denied(0, 40*us, 90*us)},
		}},
		{"fixed window peek after the rate fell", []call{
			{0, fw, 3, allowed(0, time.Second, 0)},
			{0, fwLow, 0, allowed(0, time.Second, 0)},
			{0, fwLow, 1, denied(0, time.Second, time.Second)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := model.New()
			for i, c := range tc.calls {
				got, err := m.AllowN("k", c.limit, c.n, t0+int64(c.at/us))
				if err != nil {
					t.Fatal(err)
				}
				want := c.want
				want.Limit = c.limit
				if got != want {
					t.Fatalf("call %d:\n got %+v\nwant %+v", i, got, want)
				}
			}
		})
	}
}

func TestModelRefusesCost(t *testing.T) {
	m := model.New()
	l := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: time.Second, Burst: 1, MaxDelay: time.Second}
	if got, want := model.Capacity(l), int64(3); got != want {
		t.Fatalf("Capacity = %d, want %d", got, want)
	}
	for _, n := range []int{-1, 4} {
		if _, err := m.AllowN("k", l, n, t0); !errors.Is(err, model.ErrCost) {
			t.Errorf("cost %d: err = %v, want ErrCost", n, err)
		}
	}
	if r, _ := m.AllowN("k", l, 0, t0); r.Remaining != 1 || m.Has("k", l) {
		t.Errorf("refused costs changed the key: %+v", r)
	}
}

func TestMaxDebt(t *testing.T) {
	t.Parallel()
	year := 365 * 24 * time.Hour
	for _, tc := range []struct {
		limit tollgate.Limit
		want  int64
	}{
		{tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: time.Second}, 3},
		{tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 7, Period: time.Minute}, 7},
		{tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 4, Period: 10 * time.Second}, 4},
		// 2^53/4 ÷ 31,536,000,000 ms-steps = 71,404: 50,000 may owe 21,404.
		{tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 50_000, Period: year}, 21_404},
		{tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 2, Period: time.Second, Burst: 5}, 5},
		// A token is 31,536,000,000,000 parts: 285 of them fit below 2^53.
		{tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 9_999_991, Period: year, Burst: 200}, 85},
		{tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 9_999_991, Period: year, Burst: 285}, 0},
		// A shaper's capacity counts what MaxDelay queues: 1 + 2.
		{tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: time.Second, Burst: 1, MaxDelay: time.Second}, 3},
	} {
		if got, want := model.MaxDebt(tc.limit), tc.want; got != want {
			t.Errorf("MaxDebt(%v) = %d, want %d", tc.limit, got, want)
		}
	}
}

// Settling a key in debt: a look is allowed, reports nothing remaining,
// and a refund pays the debt before it gives tokens back.
func TestSettleDebt(t *testing.T) {
	t.Parallel()
	m := model.New()
	tb := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 2, Period: time.Second, Burst: 5}
	steps := []struct {
		reserved, actual int
		want             tollgate.Result
		wrote            bool
	}{
		{5, 9, allowed(0, 4500*time.Millisecond, 0), true}, // owes 4
		{5, 5, allowed(0, 4500*time.Millisecond, 0), false},
		{5, 0, allowed(1, 2000*time.Millisecond, 0), true},
		{1, 1000, allowed(0, 5000*time.Millisecond, 0), true}, // capped: owes 5
	}
	if _, err := m.AllowN("k", tb, 5, t0); err != nil {
		t.Fatal(err)
	}
	for i, st := range steps {
		got, wrote, err := m.SettleN("k", tb, t0, st.reserved, st.actual, t0)
		if err != nil {
			t.Fatal(err)
		}
		want := st.want
		want.Limit = tb
		if got != want || wrote != st.wrote {
			t.Fatalf("settle %d: got %+v (wrote %v), want %+v (wrote %v)", i, got, wrote, want, st.wrote)
		}
	}
	if _, _, err := m.SettleN("k", tb, t0, 6, 0, t0); !errors.Is(err, model.ErrCost) {
		t.Errorf("reserved above the burst: err = %v, want ErrCost", err)
	}
}
