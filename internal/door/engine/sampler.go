package engine

import (
	"log/slog"
	"sync"
	"time"
)

// SkippedKey is the name of the attribute, on every sampled log record,
// that says how many similar events were left out since the previous
// record. It names events, not requests: a record saying 4 was preceded by
// 4 more failures that were answered (by failure mode) but not logged.
const SkippedKey = "similar_events_not_logged"

// Skipped is the SkippedKey attribute for n events left out.
func Skipped(n int) slog.Attr { return slog.Int(SkippedKey, n) }

// Sampler lets one event through per interval and counts the ones it holds
// back, so that a store outage under load produces one log record every
// interval — saying how many were left out since the previous one — rather
// than one per request. The zero value lets every event through; set Every
// before first use. A Sampler is safe for concurrent use.
type Sampler struct {
	// Every is the interval; 0 or less lets every event through.
	Every time.Duration

	mu         sync.Mutex
	next       time.Time
	suppressed int
}

// Allow reports whether the event at now is to be logged and, when it is,
// how many events were held back since the last one that was.
func (s *Sampler) Allow(now time.Time) (ok bool, suppressed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Every > 0 && now.Before(s.next) {
		s.suppressed++
		return false, 0
	}
	s.next = now.Add(s.Every)
	suppressed, s.suppressed = s.suppressed, 0
	return true, suppressed
}
