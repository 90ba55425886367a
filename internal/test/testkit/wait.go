package testkit

import (
	"sync/atomic"
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing the test after a generous
// 30 s: tests wait for states, never for durations. what names the state
// in the failure.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			tb.Fatalf("gave up waiting for %s", what)
		}
	}
}

// InFlight counts the handlers running at once (Enter, Leave) and the most
// ever seen (Peak). It is safe for concurrent use.
type InFlight struct{ now, peak atomic.Int64 }

// Enter counts a handler in.
func (f *InFlight) Enter() {
	n := f.now.Add(1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
}

// Leave counts a handler out.
func (f *InFlight) Leave() { f.now.Add(-1) }

// Now is how many handlers run now.
func (f *InFlight) Now() int64 { return f.now.Load() }

// Peak is the most that ever ran at once.
func (f *InFlight) Peak() int64 { return f.peak.Load() }

// ResetPeak forgets the peak, for a new round of the same handlers.
func (f *InFlight) ResetPeak() { f.peak.Store(f.now.Load()) }
