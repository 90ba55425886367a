package tollgate

import (
	"testing"
	"time"
)

// Two limits a service alternates between must both stay cached, even when
// they hash to the same place: validating a limit again on every call
// allocates and costs a decision a fifth of its time.
func TestParamsCacheKeepsTwoCollidingLimits(t *testing.T) {
	a := Limit{Algorithm: TokenBucket, Rate: 10, Period: time.Second}
	var b Limit
	for r := 11; ; r++ {
		b = Limit{Algorithm: TokenBucket, Rate: r, Period: time.Second}
		if cacheSet(b) == cacheSet(a) {
			break
		}
	}
	for _, l := range []Limit{a, b} {
		if _, err := CheckRequest("k", l, 1); err != nil {
			t.Fatal(err)
		}
	}
	got := testing.AllocsPerRun(100, func() {
		_, _ = CheckRequest("k", a, 1)
		_, _ = CheckRequest("k", b, 1)
	})
	if got != 0 {
		t.Errorf("allocations per pair of checks = %v, want 0 (limits %v and %v share a cache set)", got, a, b)
	}
}
