package redisstore_test

import (
	"context"
	"os"
	"testing"

	"github.com/tollgate/tollgate/internal/exact"
)

// TestMulDiv runs lib.lua's exact multiply-divide in Redis on cases where a
// double is one off, and at the limits; internal/exact computes the same in
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
