package exact_test

import (
	"math"
	"testing"

	"github.com/tollgate/tollgate/internal/store/exact"
)

// Cases where a double, ⌊v/from·to⌋ or ⌈v/from·to⌉, is one off; and the
// limits. Every store's conversion must agree with these.
var mulDivCases = []struct {
	v, to, from, limit int64
	down, up           int64
}{
	{498, 500_000, 1_000_000, exact.Max, 249, 249},
	{1_048_574, 500_000, 1_000_000, exact.Max, 524_287, 524_287},
	{1, 7, 3, exact.Max, 2, 3},
	{0, 12345, 678, exact.Max, 0, 0},
	{exact.Max - 1, exact.Max - 1, exact.Max - 3, exact.Max, exact.Max, exact.Max}, // limited
	{exact.Max - 1, 3, 7, exact.Max, 3_860_228_252_031_853, 3_860_228_252_031_854},
	{1_999_999, 2_000_003, 2_000_001, exact.Max, 2_000_000, 2_000_001},
	{10, 1, 1, 5, 5, 5},
}

func TestMulDiv(t *testing.T) {
	t.Parallel()
	for _, tc := range mulDivCases {
		if got, want := exact.MulDiv(tc.v, tc.to, tc.from, tc.limit), tc.down; got != want {
			t.Errorf("MulDiv(%d, %d, %d, %d) = %d, want %d", tc.v, tc.to, tc.from, tc.limit, got, want)
		}
		if got, want := exact.MulDivUp(tc.v, tc.to, tc.from, tc.limit), tc.up; got != want {
			t.Errorf("MulDivUp(%d, %d, %d, %d) = %d, want %d", tc.v, tc.to, tc.from, tc.limit, got, want)
		}
	}
}

// The first case is one where the double is wrong: the test would pass on
// a float conversion otherwise.
func TestMulDivBeatsDouble(t *testing.T) {
	t.Parallel()
	tc := mulDivCases[0]
	if got := int64(math.Floor(float64(tc.v) / float64(tc.from) * float64(tc.to))); got == tc.down {
		t.Fatalf("the double gets %d right; pick a case where it does not", got)
	}
}
