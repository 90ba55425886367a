// Package testkit holds what tollgate's tests share: a settable Clock, so
// that a test decides at fixed instants t0, t0+d, … and never sleeps, and
// KeyPrefix, which gives each test its own Redis keys, so that tests share
// one redis-server without flushing it or reading each other's counters;
// and ConfigMap, a rules directory updated as Kubernetes updates a mounted
// ConfigMap, for tests of reloading; Logs, a slog handler that keeps what
// was logged; and Eventually and InFlight, for tests that wait for a state
// and count what runs at once.
//
// Stores and EachStore run one scenario at every store, memory and Redis.
//
// It is for tests only; nothing outside _test.go files imports it.
package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"
)

// Clock is a clock that stands still until the test moves it with Set or
// Advance. Pass its Now method wherever a clock function is taken
// (memorystore.WithClock, redisstore.WithClock, the service's WithClock). The zero
// Clock reads the zero time; NewClock starts it elsewhere. A Clock is safe
// for concurrent use, so a test may move it while the code under test
// reads it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Advance moves the clock d forwards (backwards for a negative d) and
// returns the new reading.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// KeyPrefix returns a Redis key prefix of the test's own, ending in ':':
// the test's name (shortened, with anything but letters, digits, '-' and
// '_' replaced) and a random part, so that parallel tests and repeated
// runs against one server never share a key, and a key found in the
// server names the test that wrote it.
func KeyPrefix(tb testing.TB) string {
	tb.Helper()
	name := strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, tb.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	b := make([]byte, 6)
	rand.Read(b) // never fails (crypto/rand panics rather than return an error)
	return name + "-" + hex.EncodeToString(b) + ":"
}
