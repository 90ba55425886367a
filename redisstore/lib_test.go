package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/redisstore"
)

// TestMulDiv runs lib.lua's exact multiply-divide in Redis on cases where a
// double is one off, and at the limits; internal/store/exact computes the same in
// Go.
func TestMulDiv(t *testing.T) {
	t.Parallel()
	lib, err := os.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	src := string(lib) + "\nlocal v, to, from, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n" +
		"return {muldiv(v, to, from, limit, false), muldiv(v, to, from, limit, true)}"
	client := standalone(t)
	for _, tc := range []struct {
		v, to, from, limit int64
		down, up           int64
	}{
		{498, 500_000, 1_000_000, exact.Max, 249, 249}, // a double: 248
		{1_048_574, 500_000, 1_000_000, exact.Max, 524_287, 524_287},
		{1, 7, 3, exact.Max, 2, 3},
		{0, 12345, 678, exact.Max, 0, 0},
		{exact.Max - 1, exact.Max - 1, exact.Max - 3, exact.Max, exact.Max, exact.Max},
		{exact.Max - 1, 3, 7, exact.Max, 3_860_228_252_031_853, 3_860_228_252_031_854},
		{1_999_999, 2_000_003, 2_000_001, exact.Max, 2_000_000, 2_000_001},
		{10, 1, 1, 5, 5, 5},
		{123_456_789_012, 86_400_000_000, 3_600_000_000, exact.Max, 2_962_962_936_288, 2_962_962_936_288},
		{7, 999_999_937, 1_000_000_007, exact.Max, 6, 7},
	} {
		reply, err := client.Eval(context.Background(), src, nil, tc.v, tc.to, tc.from, tc.limit).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := reply[0], tc.down; got != want {
			t.Errorf("muldiv(%d, %d, %d, %d) = %d, want %d", tc.v, tc.to, tc.from, tc.limit, got, want)
		}
		if got, want := reply[1], tc.up; got != want {
			t.Errorf("muldiv(%d, %d, %d, %d, up) = %d, want %d", tc.v, tc.to, tc.from, tc.limit, got, want)
		}
		if got, want := exact.MulDiv(tc.v, tc.to, tc.from, tc.limit), tc.down; got != want {
			t.Errorf("exact.MulDiv(%d, %d, %d, %d) = %d, want %d", tc.v, tc.to, tc.from, tc.limit, got, want)
		}
	}
}

// TestMulDivRandom compares lib.lua's muldiv with internal/store/exact's on random
// operands of every size up to 2^53.
func TestMulDivRandom(t *testing.T) {
	t.Parallel()
	lib, err := os.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	// One call checks a batch: ARGV holds quadruples, the reply the results.
	src := string(lib) + `
local out = {}
for i = 1, #ARGV, 4 do
  local v, to, from, limit = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  out[#out + 1] = muldiv(v, to, from, limit, false)
  out[#out + 1] = muldiv(v, to, from, limit, true)
end
return out`
	rng := rand.New(rand.NewPCG(9, 10))
	operand := func() int64 { return rng.Int64N(1 << uint(1+rng.IntN(53))) }
	client := standalone(t)
	for batch := 0; batch < 20; batch++ {
		var args []any
		var want []int64
		for range 100 {
			v, to, from := operand(), operand(), max(1, operand())
			limit := int64(exact.Max)
			if rng.IntN(4) == 0 {
				limit = operand()
			}
			args = append(args, v, to, from, limit)
			want = append(want, exact.MulDiv(v, to, from, limit), exact.MulDivUp(v, to, from, limit))
		}
		got, err := client.Eval(context.Background(), src, nil, args...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] {
				q := args[i/2*4 : i/2*4+4]
				t.Fatalf("muldiv(%v, %v, %v, %v, up=%v) = %d, want %d", q[0], q[1], q[2], q[3], i%2 == 1, got[i], want[i])
			}
		}
	}
}

// TestGCRAReadsEitherForm: a TAT stored as a plain integer of µs (the form
// with no fraction, and the only one older versions wrote) reads with a
// fraction of 0; a TAT with a fraction is stored as '<µs>:<fraction>:<units
// per µs>'.
func TestGCRAReadsEitherForm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := standalone(t)
	clock := conformance.NewClock()
	s := redisstore.New(client, redisstore.WithClock(clock.Now))
	limit := tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 3, Period: time.Second, Burst: 3}
	key := fmt.Sprint("gcra-form:", rand.Int64())
	rkey := s.Key(key, limit)
	t0 := conformance.T0.UnixMicro()
	if err := client.Set(ctx, rkey, strconv.FormatInt(t0+1_000_000, 10), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at   time.Duration
		n    int
		want tollgate.Result
		tat  string
	}{
		{0, 1, tollgate.Result{Limit: limit, RetryAfter: 333334 * time.Microsecond, ResetAfter: time.Second}, strconv.FormatInt(t0+1_000_000, 10)},
		{333334 * time.Microsecond, 1, tollgate.Result{Allowed: true, Limit: limit, ResetAfter: time.Second}, strconv.FormatInt(t0+1_333_333, 10) + ":1:3"},
	} {
		clock.Set(tc.at)
		got, err := s.AllowN(ctx, key, limit, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("at %v: got %+v, want %+v", tc.at, got, tc.want)
		}
		if got, err := client.Get(ctx, rkey).Result(); err != nil || got != tc.tat {
			t.Errorf("at %v: stored %q (%v), want %q", tc.at, got, err, tc.tat)
		}
	}
}
