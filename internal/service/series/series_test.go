package series

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestBound(t *testing.T) {
	t.Parallel()
	b := New(2, 10)
	for i, tc := range []struct {
		name string
		want bool
	}{
		{"a", true},
		{"b", true},
		{"a", true},                      // admitted before
		{"c", false},                     // no room
		{strings.Repeat("x", 11), false}, // too long
		{strings.Repeat("x", 10), false}, // short enough, but no room
		{"b", true},
	} {
		if got := b.Admit(tc.name); got != tc.want {
			t.Errorf("%d: Admit(%q) = %v, want %v", i, tc.name, got, tc.want)
		}
	}
	if got, want := b.Folded(), uint64(3); got != want {
		t.Errorf("Folded = %d, want %d", got, want)
	}
}

func TestBoundDefaults(t *testing.T) {
	t.Parallel()
	if max, maxBytes := New(0, -1).Limits(); max != DefaultMax || maxBytes != DefaultMaxBytes {
		t.Errorf("Limits = %d, %d, want %d, %d", max, maxBytes, DefaultMax, DefaultMaxBytes)
	}
}

// TestBoundConcurrent: however many callers race, no more names than the
// bound are admitted, and every refusal is counted.
func TestBoundConcurrent(t *testing.T) {
	t.Parallel()
	b := New(100, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := map[string]bool{}
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				name := fmt.Sprintf("n%d", (g*37+i)%300)
				if b.Admit(name) {
					mu.Lock()
					admitted[name] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if got, want := len(admitted), 100; got != want {
		t.Errorf("%d names admitted, want %d", got, want)
	}
	if b.Folded() == 0 {
		t.Error("nothing folded, with 300 names for 100 places")
	}
}
