package testkit_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testkit"
)

func TestClock(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		move func(c *testkit.Clock)
		want time.Time
	}{
		{"still", func(c *testkit.Clock) {}, t0},
		{"set", func(c *testkit.Clock) { c.Set(t0.Add(time.Hour)) }, t0.Add(time.Hour)},
		{"set back", func(c *testkit.Clock) { c.Set(t0.Add(-time.Minute)) }, t0.Add(-time.Minute)},
		{"advance twice", func(c *testkit.Clock) { c.Advance(time.Second); c.Advance(2 * time.Second) }, t0.Add(3 * time.Second)},
		{"advance back", func(c *testkit.Clock) { c.Advance(-time.Second) }, t0.Add(-time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := testkit.NewClock(t0)
			tc.move(c)
			if got, want := c.Now(), tc.want; !got.Equal(want) {
				t.Errorf("Now() = %v, want %v", got, want)
			}
		})
	}
}

func TestClockAdvanceReturnsReading(t *testing.T) {
	t.Parallel()
	var c testkit.Clock
	if got, want := c.Advance(time.Minute), (time.Time{}).Add(time.Minute); !got.Equal(want) {
		t.Errorf("Advance = %v, want %v", got, want)
	}
}

// TestClockConcurrent moves the clock from many goroutines while others
// read it; run under -race, and every step counted.
func TestClockConcurrent(t *testing.T) {
	t.Parallel()
	var c testkit.Clock
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Advance(time.Millisecond)
			}
		}()
		go func() {
			defer wg.Done()
			for range 100 {
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	if got, want := c.Now().Sub(time.Time{}), 800*time.Millisecond; got != want {
		t.Errorf("after 800 steps of 1ms: %v, want %v", got, want)
	}
}

func TestKeyPrefix(t *testing.T) {
	t.Parallel()
	a, b := testkit.KeyPrefix(t), testkit.KeyPrefix(t)
	if a == b {
		t.Errorf("two prefixes are both %q, want different ones", a)
	}
	if !strings.HasPrefix(a, "TestKeyPrefix-") || !strings.HasSuffix(a, ":") {
		t.Errorf("KeyPrefix = %q, want TestKeyPrefix-…:", a)
	}
	t.Run("odd {name} with spaces and a long tail to be cut short", func(t *testing.T) {
		got := testkit.KeyPrefix(t)
		name, _, _ := strings.Cut(got, "-")
		if strings.ContainsAny(got, "{} /") || len(name) > 40 {
			t.Errorf("KeyPrefix = %q: want no braces, spaces or slashes and a name of at most 40 bytes", got)
		}
	})
}
