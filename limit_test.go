package tollgate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	s := time.Second
	for _, tc := range []struct {
		name  string
		limit tollgate.Limit
		ok    bool
	}{
		{"per second", tollgate.PerSecond(10), true},
		{"per day, a million", tollgate.PerDay(1_000_000), true},
		{"window ignores burst", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: s}, true},
		{"shaping", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 5, Period: s, Burst: 1, MaxDelay: s}, true},
		{"year-long window", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 1e9, Period: 365 * 24 * time.Hour}, true},
		{"sliding counter per day", tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 10_000_000, Period: 24 * time.Hour}, true},
		{"sliding log at its bound", tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: tollgate.MaxLogRate, Period: s}, true},
		{"gcra below a µs", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 2_000_000, Period: s, Burst: 2_000_000}, true},

		{"zero burst is a burst of rate", tollgate.Limit{Rate: 5, Period: s}, true},
		{"negative burst", tollgate.Limit{Rate: 5, Period: s, Burst: -1}, false},
		{"zero rate", tollgate.Limit{Rate: 0, Period: s, Burst: 1}, false},
		{"negative rate", tollgate.Limit{Rate: -1, Period: s, Burst: 1}, false},
		{"zero period", tollgate.Limit{Rate: 1, Burst: 1}, false},
		{"negative period", tollgate.Limit{Rate: 1, Period: -s, Burst: 1}, false},
		{"sub-microsecond period", tollgate.Limit{Rate: 1, Period: 1500 * time.Nanosecond, Burst: 1}, false},
		{"period over 814 days", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 1, Period: 1000 * 24 * time.Hour}, false},
		{"bucket without burst is a burst of rate", tollgate.Limit{Rate: 1, Period: s}, true},
		{"gcra without burst is a burst of rate", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 1, Period: s}, true},
		{"leaky without burst is a burst of rate", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: s}, true},
		{"unknown algorithm", tollgate.Limit{Algorithm: 6, Rate: 1, Period: s, Burst: 1}, false},
		{"max delay on token bucket", tollgate.Limit{Rate: 1, Period: s, Burst: 1, MaxDelay: s}, false},
		{"negative max delay", tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 1, Period: s, Burst: 1, MaxDelay: -s}, false},
		{"too fine to count exactly", tollgate.Limit{Rate: 1_000_003, Period: 24 * time.Hour, Burst: 1_000_000}, false},
		{"sliding counter too fine", tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 1e9, Period: 24 * time.Hour}, false},
		{"gcra horizon", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 1, Period: 24 * time.Hour, Burst: 1_000_000}, false},
		{"sliding log above its bound", tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: tollgate.MaxLogRate + 1, Period: s}, false},
		{"sliding log of 300,000", tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 300_000, Period: time.Minute}, false},
	} {
		err := tc.limit.Validate()
		if got, want := err == nil, tc.ok; got != want {
			t.Errorf("%s: %v.Validate() = %v, want ok=%v", tc.name, tc.limit, err, want)
		}
		if err != nil && !errors.Is(err, tollgate.ErrInvalidLimit) {
			t.Errorf("%s: error %v does not wrap ErrInvalidLimit", tc.name, err)
		}
	}
}

// TestMaxLogRateMessage: the error names the bound and the alternative.
func TestMaxLogRateMessage(t *testing.T) {
	t.Parallel()
	err := tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 300_000, Period: time.Minute}.Validate()
	if err == nil {
		t.Fatal("Validate() = nil, want an error")
	}
	for _, want := range []string{"1000", "MaxLogRate", "sliding_window_counter"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestLimitString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit tollgate.Limit
		want  string
	}{
		{tollgate.PerSecond(10), "10/s burst 10 token_bucket"},
		{tollgate.PerHour(5), "5/h burst 5 token_bucket"},
		{tollgate.PerDay(1000), "1000/24h burst 1000 token_bucket"},
		{tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 3, Period: 90 * time.Second, Burst: 2}, "3/1m30s burst 2 gcra"},
		{tollgate.Limit{Rate: 4, Period: time.Minute}, "4/m burst 4 token_bucket"},
		{tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 7, Period: 10 * time.Minute}, "7/10m fixed_window"},
		{tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: 5, Period: 250 * time.Millisecond}, "5/250ms sliding_window_log"},
		{tollgate.Limit{Algorithm: 9, Rate: 1, Period: time.Second}, "1/s Algorithm(9)"},
	} {
		if got := tc.limit.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit tollgate.Limit
		want  int
	}{
		{tollgate.Limit{Rate: 2, Period: time.Second, Burst: 5}, 5},
		{tollgate.Limit{Rate: 7, Period: time.Second}, 7}, // burst 0: a burst of rate
		{tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 7, Period: time.Second, Burst: 100}, 7},
		// Shaping: from empty, 2s of delay at 2/s queues 4 more than the burst.
		{tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 2, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second}, 5},
		{tollgate.Limit{Rate: 0, Period: time.Second, Burst: 5}, 0}, // invalid
	} {
		if got := tc.limit.Capacity(); got != tc.want {
			t.Errorf("%v.Capacity() = %d, want %d", tc.limit, got, tc.want)
		}
	}
}

func TestParamsReduceExactly(t *testing.T) {
	t.Parallel()
	p, err := tollgate.PerDay(1_000_000).Params()
	if err != nil {
		t.Fatal(err)
	}
	// A million a day is one per 86,400µs: 86,400 units a token, 1 unit per µs.
	if p.Unit != 86_400 || p.UnitRate != 1 || p.IntervalUS != 86_400 {
		t.Errorf("Params = %+v, want Unit 86400, UnitRate 1, IntervalUS 86400", p)
	}
}

func TestAlgorithmText(t *testing.T) {
	t.Parallel()
	for _, a := range tollgate.Algorithms() {
		text, err := a.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got tollgate.Algorithm
		if err := got.UnmarshalText(text); err != nil || got != a {
			t.Errorf("round trip of %v: got %v, %v", a, got, err)
		}
	}
	if _, err := tollgate.ParseAlgorithm("token-bucket"); !errors.Is(err, tollgate.ErrInvalidLimit) {
		t.Errorf("ParseAlgorithm(token-bucket): err = %v, want ErrInvalidLimit", err)
	}
}

func TestCheckRequest(t *testing.T) {
	t.Parallel()
	long := string(make([]byte, tollgate.MaxKeyLen+1))
	max := string(make([]byte, tollgate.MaxKeyLen))
	for _, tc := range []struct {
		name string
		key  string
		n    int
		want error
	}{
		{"ok", "k", 1, nil},
		{"look", "k", 0, nil},
		{"longest key", max, 1, nil},
		{"empty key", "", 1, tollgate.ErrInvalidKey},
		{"key too long", long, 1, tollgate.ErrInvalidKey},
		{"negative cost", "k", -1, tollgate.ErrInvalidCost},
		{"cost above burst", "k", 11, tollgate.ErrCostExceedsBurst},
	} {
		_, err := tollgate.CheckRequest(tc.key, tollgate.PerSecond(10), tc.n)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
}
