package httplimit

import (
	"context"
	"time"

	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/settings"
)

// SetWait replaces how shaped requests wait, so that tests can record the
// delays instead of sleeping.
func SetWait(l *Limiter, f func(context.Context, time.Duration) error) { l.wait = f }

// WithClock sets the clock X-RateLimit-Reset is computed from and failure
// logs are paced by (default time.Now).
func WithClock(now func() time.Time) enforce.Option {
	return func(s *settings.Door) { s.Now = now }
}
