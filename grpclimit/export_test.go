package grpclimit

import (
	"time"

	"github.com/tollgate/tollgate/internal/door/ruleset"
)

// WithClock sets the clock the x-ratelimit-reset metadata is computed from
// and failure logs are paced by (default time.Now).
func WithClock(now func() time.Time) Option { return shared(ruleset.WithClock(now)) }
