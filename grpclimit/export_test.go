package grpclimit

import (
	"time"

	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/settings"
)

// WithClock sets the clock the x-ratelimit-reset metadata is computed from
// and failure logs are paced by (default time.Now).
func WithClock(now func() time.Time) enforce.Option {
	return func(s *settings.Door) { s.Now = now }
}
