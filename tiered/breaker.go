package tiered

import (
	"sync"
	"sync/atomic"
	"time"
)

// State is the circuit breaker's state.
type State int32

const (
	// Closed: decisions go to the global store.
	Closed State = iota
	// Open: the global store failed too often; decisions are made locally
	// until the cool-down ends.
	Open
	// HalfOpen: the cool-down has ended and one decision (the probe) goes to
	// the global store; the others stay local until it answers.
	HalfOpen
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// breaker counts consecutive failures of the global store. While closed it
// costs one atomic load per decision; transitions take the lock.
type breaker struct {
	threshold int
	coolDown  time.Duration
	onChange  func(from, to State, cause error)

	state    atomic.Int32
	failures atomic.Int32

	mu       sync.Mutex
	openedAt time.Time
	probing  bool
}

// allow reports whether a decision may go to the global store now; probe is
// true for the one that tests a half-open breaker.
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	if State(b.state.Load()) == Closed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch State(b.state.Load()) {
	case Closed:
		return true, false
	case Open:
		if now.Sub(b.openedAt) < b.coolDown {
			return false, false
		}
		b.set(HalfOpen, nil)
	}
	if b.probing {
		return false, false
	}
	b.probing = true
	return true, true
}

// retryIn says how long until the breaker lets a probe through (0 when it
// is not open).
func (b *breaker) retryIn(now time.Time) time.Duration {
	if State(b.state.Load()) != Open {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.coolDown-now.Sub(b.openedAt), 0)
}

func (b *breaker) success(probe bool) {
	if !probe {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.failures.Store(0)
	b.set(Closed, nil)
}

func (b *breaker) failure(probe bool, now time.Time, err error) {
	if !probe {
		if int(b.failures.Add(1)) < b.threshold || State(b.state.Load()) != Closed {
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	} else if State(b.state.Load()) != Closed {
		return // another decision opened it first
	}
	b.openedAt = now
	b.set(Open, err)
}

// set changes the state; called with mu held.
func (b *breaker) set(to State, cause error) {
	from := State(b.state.Swap(int32(to)))
	if from != to && b.onChange != nil {
		b.onChange(from, to, cause)
	}
}

// abandon gives up a probe that ended without an answer about the global
// store (its caller went away), so that the next decision probes instead.
func (b *breaker) abandon(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}
