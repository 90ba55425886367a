package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type ctxKey struct{}

func TestStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ timeout, want time.Duration }{
		{50 * time.Millisecond, time.Millisecond},
		{8 * time.Millisecond, time.Millisecond},
		{4 * time.Millisecond, 500 * time.Microsecond},
		{time.Microsecond, time.Microsecond},
	} {
		if got := NewDeadlines(tc.timeout).step; got != tc.want {
			t.Errorf("NewDeadlines(%v).step = %v, want %v", tc.timeout, got, tc.want)
		}
	}
}

// TestDeadlineBounds hands out contexts from several goroutines and checks
// each: its deadline is at least the timeout after the call began (so it
// was not already expired when handed out, unless the call itself took
// longer than the timeout), at most timeout+step after it returned, and
// it is never done before its deadline.
func TestDeadlineBounds(t *testing.T) {
	t.Parallel()
	for _, timeout := range []time.Duration{2 * time.Millisecond, 20 * time.Millisecond} {
		d := NewDeadlines(timeout)
		step := d.step
		parent := context.WithValue(context.Background(), ctxKey{}, "trace-1")
		var wg sync.WaitGroup
		var mu sync.Mutex
		var n, short, long, early, lost int
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
					t0 := time.Now()
					ctx := d.Context(parent)
					t1 := time.Now()
					dl, ok := ctx.Deadline()
					err := ctx.Err()
					t2 := time.Now()
					mu.Lock()
					n++
					if !ok || dl.Before(t0.Add(timeout)) {
						short++
					}
					if dl.After(t1.Add(timeout + step)) {
						long++
					}
					if err != nil && t2.Before(dl) {
						early++
					}
					if ctx.Value(ctxKey{}) != "trace-1" {
						lost++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if short+long+early+lost > 0 {
			t.Errorf("timeout %v: of %d contexts, %d had less than the timeout, %d more than timeout+step (%v), %d were done before their deadline, %d lost the caller's values",
				timeout, n, short, long, step, early, lost)
		}
	}
}

func TestDeadlineFires(t *testing.T) {
	t.Parallel()
	d := NewDeadlines(30 * time.Millisecond)
	ctx := d.Context(context.Background())
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second): // only a broken deadline gets here
		t.Fatal("the deadline never fired")
	}
	if got := ctx.Err(); !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("Err() = %v after Done, want DeadlineExceeded", got)
	}
}

// TestContextIgnoresParent: Context keeps neither the caller's deadline nor
// its cancellation (AnswerBy, tested below, is what honours them).
func TestContextIgnoresParent(t *testing.T) {
	t.Parallel()
	d := NewDeadlines(time.Second)
	soon, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	ctx := d.Context(soon)
	cancel()
	if err := ctx.Err(); err != nil {
		t.Errorf("Context's context ended with its caller's: %v", err)
	}
}

// TestEpochsReleased: once their deadlines pass, the epochs' contexts are
// released at the next rotation; only the current one stays.
func TestEpochsReleased(t *testing.T) {
	t.Parallel()
	d := NewDeadlines(2 * time.Millisecond)
	var all []context.Context
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
		all = append(all, d.Context(context.Background()))
	}
	for _, ctx := range all {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a deadline never fired")
		}
	}
	d.Context(context.Background())
	d.mu.Lock()
	kept := len(d.old)
	d.mu.Unlock()
	if kept != 1 {
		t.Errorf("%d epochs kept after the others expired, want 1 (the current one)", kept)
	}
	for _, ctx := range all {
		if got := ctx.Err(); !errors.Is(got, context.DeadlineExceeded) {
			t.Fatalf("Err() = %v, want DeadlineExceeded", got)
		}
	}
}

func TestSampler(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type event struct {
		at         time.Duration
		ok         bool
		suppressed int
	}
	for _, tc := range []struct {
		name   string
		every  time.Duration
		events []event
	}{
		{"one a second", time.Second, []event{
			{0, true, 0}, {100 * time.Millisecond, false, 0}, {999 * time.Millisecond, false, 0},
			{time.Second, true, 2}, {1500 * time.Millisecond, false, 0}, {5 * time.Second, true, 1},
		}},
		{"every one", 0, []event{{0, true, 0}, {0, true, 0}, {time.Millisecond, true, 0}}},
	} {
		s := Sampler{Every: tc.every}
		for i, e := range tc.events {
			ok, suppressed := s.Allow(t0.Add(e.at))
			if got, want := ok, e.ok; got != want {
				t.Errorf("%s: event %d: ok = %v, want %v", tc.name, i, got, want)
			}
			if got, want := suppressed, e.suppressed; got != want {
				t.Errorf("%s: event %d: suppressed = %d, want %d", tc.name, i, got, want)
			}
		}
	}
}

// sink keeps the benchmarks' contexts from living on the stack, as they do
// not in a real call.
var sink atomic.Pointer[context.Context]

// BenchmarkDeadlines is the cost of a call's deadline, against
// context.WithTimeout as the peer.
func BenchmarkDeadlines(b *testing.B) {
	parent := context.WithValue(context.Background(), ctxKey{}, 1)
	b.Run("shared", func(b *testing.B) {
		d := NewDeadlines(50 * time.Millisecond)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var ctx context.Context
			for pb.Next() {
				ctx = d.Context(parent)
			}
			sink.Store(&ctx)
		})
	})
	b.Run("WithTimeout", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, cancel := context.WithTimeout(parent, 50*time.Millisecond)
				cancel()
			}
		})
	})
}

// TestAnswerBy: the store calls of a service's request end at the sooner of
// the shared deadline and the caller's deadline less the reply reserve.
func TestAnswerBy(t *testing.T) {
	t.Parallel()
	shared := NewDeadlines(50 * time.Millisecond)
	tests := []struct {
		name   string
		d      *Deadlines
		caller time.Duration // 0: no deadline of the caller's
		// the deadline must lie within [lo, hi] from the start
		lo, hi time.Duration
		none   bool // no deadline at all
	}{
		{name: "caller sooner", d: shared, caller: 20 * time.Millisecond, lo: 10 * time.Millisecond, hi: 11 * time.Millisecond},
		{name: "caller later", d: shared, caller: time.Hour, lo: 50 * time.Millisecond, hi: 50*time.Millisecond + shared.step},
		{name: "caller without deadline", d: shared, lo: 50 * time.Millisecond, hi: 50*time.Millisecond + shared.step},
		{name: "no timeout, caller's deadline", caller: time.Second, lo: 990 * time.Millisecond, hi: 990 * time.Millisecond},
		{name: "no timeout, no deadline", none: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent := context.WithValue(context.Background(), ctxKey{}, "v")
			start := time.Now()
			if tc.caller > 0 {
				var cancel context.CancelFunc
				parent, cancel = context.WithDeadline(parent, start.Add(tc.caller))
				defer cancel()
			}
			ctx, cancel := tc.d.AnswerBy(parent)
			defer cancel()
			took := time.Since(start) // a loaded machine may delay the call
			if got, want := ctx.Value(ctxKey{}), "v"; got != want {
				t.Errorf("value %v, want %v", got, want)
			}
			dl, ok := ctx.Deadline()
			if got, want := ok, !tc.none; got != want {
				t.Fatalf("has deadline %v, want %v", got, want)
			}
			if tc.none {
				return
			}
			// The shared deadline is set when its epoch starts, which may be
			// up to a step before this call.
			if got := dl.Sub(start); got < tc.lo-shared.step || got > tc.hi+took {
				t.Errorf("deadline %v after the start, want within [%v, %v]", got, tc.lo, tc.hi)
			}
		})
	}
}

func TestReplyReserve(t *testing.T) {
	t.Parallel()
	tests := []struct{ remaining, want time.Duration }{
		{-time.Millisecond, 0},
		{0, 0},
		{12 * time.Millisecond, 6 * time.Millisecond},
		{20 * time.Millisecond, 10 * time.Millisecond},
		{time.Second, MaxReplyReserve},
	}
	for _, tc := range tests {
		if got := ReplyReserve(tc.remaining); got != tc.want {
			t.Errorf("ReplyReserve(%v) = %v, want %v", tc.remaining, got, tc.want)
		}
	}
}
