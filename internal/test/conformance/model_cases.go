package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/model"
)

// ModelCase is a short sequence of calls on one key whose every Result must
// equal the model's: the smallest reproductions of what the random
// differential has found, kept so that each stays fixed.
type ModelCase struct {
	Name  string
	Calls []ModelCall
}

// ModelCall is one call of a ModelCase, at T0+At.
type ModelCall struct {
	At    time.Duration
	Limit tollgate.Limit
	N     int
}

// ModelCases returns the cases.
func ModelCases() []ModelCase {
	const us = time.Microsecond
	swc := tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 10, Period: 2 * us}
	swl := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 2, Period: 100 * us}
	fw := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Period: time.Second}
	fwLow := fw
	fwLow.Rate = 1
	tbHigh := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10_000_000, Period: 24 * time.Hour, Burst: 200_000_000}
	tbLow := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: 24 * time.Hour, Burst: 2}
	lbHigh := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10_000_000, Period: 24 * time.Hour, Burst: 1_000_000_000}
	lbLow := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: 24 * time.Hour, Burst: 1}
	shaper := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: time.Second, Burst: 1, MaxDelay: time.Second}
	tbFast := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 1}
	tbSlow := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: time.Second, Burst: 1}
	gcra := tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 3, Period: time.Second, Burst: 3}
	logRun := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 20, Period: time.Second}
	// A state expired under the limit that set its expiry decides as no
	// state under any other, also while the store still holds it.
	lbFilled := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 8285, Period: 24 * time.Hour, Burst: 2, MaxDelay: 53 * us}
	lbLowered := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 23, Period: 24 * time.Hour, Burst: 2, MaxDelay: 20800 * time.Millisecond}
	tbBurst2 := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 2}
	tbBurst5 := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 10, Period: time.Second, Burst: 5}
	tbMicro := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: us, Burst: 1}
	tbMicroDeep := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: us, Burst: 1000}
	fwShort := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 1, Period: 100 * us}
	swcShort := tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 1, Period: 100 * us}
	swlShort := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 1, Period: 100 * us}
	gcraShort := tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 1, Period: 100 * us, Burst: 1}
	var sameMicro []ModelCall
	for range 13 {
		sameMicro = append(sameMicro, ModelCall{0, logRun, 1})
	}
	return []ModelCase{
		// The next window admits at its start; RetryAfter must not point
		// back into this window (or before now).
		{"sliding counter RetryAfter into the next window", []ModelCall{
			{0, swc, 10}, {3 * us, swc, 2}, {3 * us, swc, 4},
		}},
		// A call at 205µs must not forget the entry at 100µs: after the
		// clock steps back to 160µs it still counts.
		{"sliding log keeps entries a later call saw expire", []ModelCall{
			{100 * us, swl, 1}, {150 * us, swl, 1}, {205 * us, swl, 0}, {160 * us, swl, 1},
		}},
		// Nor must a denial at 205µs: it writes nothing, so the entry at
		// 100µs still counts once the clock is back at 160µs.
		{"sliding log keeps entries a later denial saw expire", []ModelCall{
			{100 * us, swl, 1}, {150 * us, swl, 1}, {205 * us, swl, 2}, {160 * us, swl, 1},
		}},
		{"fixed window peek after the limit was lowered", []ModelCall{
			{0, fw, 3}, {0, fwLow, 0},
		}},
		// Converting 2×10^8 tokens to the unit of 1/day must not overflow.
		{"token bucket rate lowered on a full bucket", []ModelCall{
			{0, tbHigh, 1}, {0, tbLow, 1},
		}},
		// A level of 10^9 draining at 1/day would take longer than any
		// time.Duration: it is clamped to what the new limit can hold.
		{"leaky bucket rate lowered on a full bucket", []ModelCall{
			{0, lbHigh, 1_000_000_000}, {0, lbLow, 1},
		}},
		{"GCRA exact interval of 1/3 s", []ModelCall{
			{0, gcra, 3}, {0, gcra, 1},
		}},
		{"shaper delay within MaxDelay after the clock stepped back", []ModelCall{
			{time.Second, shaper, 1}, {time.Second / 2, shaper, 1},
		}},
		{"sliding log entries sharing one microsecond", sameMicro},
		// The admission keeps the key 100ms, full again at 10/s; the
		// denial under 1/s reports 500ms and must keep it that long.
		{"a denial after the rate was lowered outlives the write's expiry", []ModelCall{
			{0, tbFast, 1}, {50 * time.Millisecond, tbSlow, 1}, {200 * time.Millisecond, tbSlow, 1},
		}},
		// Empty about 21s after it was filled, at 8285 a day: 83s later,
		// under 23 a day, the request finds no state and goes at once.
		{"a leaky bucket expired before its rate was lowered", []ModelCall{
			{0, lbFilled, 2}, {83 * time.Second, lbLowered, 1},
		}},
		// Full 200ms after it was emptied, at burst 2: under burst 5 it
		// is a fresh bucket of 5.
		{"a token bucket expired before its burst was raised", []ModelCall{
			{0, tbBurst2, 2}, {300 * time.Millisecond, tbBurst5, 5},
		}},
		// Full again 1µs after the write: 500µs later a burst of 1,000
		// finds no state, although a TTL of whole milliseconds has not
		// run out.
		{"a token bucket expires to the microsecond", []ModelCall{
			{0, tbMicro, 1}, {500 * us, tbMicroDeep, 1000},
		}},
		// A look at an expired state forgets it: when the clock then steps
		// back, the request finds nothing it spent before.
		{"a fixed window a look saw expired", []ModelCall{
			{0, fwShort, 1}, {1500 * us, fwShort, 0}, {50 * us, fwShort, 1},
		}},
		{"a sliding counter a look saw expired", []ModelCall{
			{0, swcShort, 1}, {1500 * us, swcShort, 0}, {50 * us, swcShort, 1},
		}},
		{"a sliding log a look saw expired", []ModelCall{
			{0, swlShort, 1}, {1500 * us, swlShort, 0}, {50 * us, swlShort, 1},
		}},
		{"a GCRA time a look saw expired", []ModelCall{
			{0, gcraShort, 1}, {1500 * us, gcraShort, 0}, {50 * us, gcraShort, 1},
		}},
	}
}

// RunModelCases runs every ModelCase on the store target makes, each on a
// key of its own, and fails at the first Result that differs from the
// model's. It checks what the store keeps with target's hooks, as
// ModelDifferential does. Each case runs twice: once with every state the
// model says has expired deleted from the store before the next call on it
// (target's Expire, or Reset), once with it left for the store to find.
func RunModelCases(t *testing.T, target ModelTarget) {
	for _, mc := range ModelCases() {
		for _, drop := range []bool{true, false} {
			name := mc.Name + "/expired state kept"
			if drop {
				name = mc.Name + "/expired state deleted"
			}
			t.Run(name, func(t *testing.T) { runModelCase(t, target, mc, drop) })
		}
	}
}

func runModelCase(t *testing.T, target ModelTarget, mc ModelCase, drop bool) {
	clock := NewClock()
	s := target.New(t, clock.Now)
	m := model.New()
	key := fmt.Sprintf("modelcase:%d", rand.Int64())
	for i, c := range mc.Calls {
		clock.Set(c.At)
		now := T0.Add(c.At).UnixMicro()
		live := expireBefore(t, target, s, m, key, c.Limit, now, drop)
		want, err := m.AllowN(key, c.Limit, c.N, now)
		if err != nil {
			t.Fatal(err)
		}
		wrote := want.Allowed && c.N > 0
		var before any
		if !wrote && target.Before != nil {
			before = target.Before(t, s, key, c.Limit)
		}
		got, err := s.AllowN(context.Background(), key, c.Limit, c.N)
		if err != nil {
			t.Fatalf("call %d (at T0+%v, n %d, %v): %v", i, c.At, c.N, c.Limit, err)
		}
		if got != want {
			t.Fatalf("call %d (at T0+%v, n %d, %v):\n got %s\nwant %s", i, c.At, c.N, c.Limit, show(got), show(want))
		}
		if target.After != nil && target.After(t, s, key, c.Limit, got, wrote, before, expiryAfter(m, key, c.Limit, got, wrote, live)) {
			m.Reset(key, c.Limit)
		}
	}
}
