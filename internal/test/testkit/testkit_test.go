package testkit_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/testkit"
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

// TestConfigMap reads the files of a ConfigMap through its links after
// each update, and wants only the newest data left on disk.
func TestConfigMap(t *testing.T) {
	t.Parallel()
	cm := &testkit.ConfigMap{Dir: t.TempDir()}
	for _, v := range []string{"one", "two", "three"} {
		cm.Update(t, map[string]string{"rules.yaml": v, "sub/more.yaml": v + "!"})
		for name, want := range map[string]string{"rules.yaml": v, "sub/more.yaml": v + "!"} {
			b, err := os.ReadFile(filepath.Join(cm.Dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(b); got != want {
				t.Errorf("after update %q: %s = %q, want %q", v, name, got, want)
			}
		}
		if fi, err := os.Lstat(filepath.Join(cm.Dir, "rules.yaml")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("rules.yaml: %v, %v; want a symlink through ..data", fi, err)
		}
	}
	entries, err := os.ReadDir(cm.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var dirs int
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..2026") {
			dirs++
		}
	}
	if got, want := dirs, 1; got != want {
		t.Errorf("%d data directories left, want %d", got, want)
	}
}
