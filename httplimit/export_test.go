package httplimit

import (
	"context"
	"time"
)

// SetWait replaces how shaped requests wait, so that tests can record the
// delays instead of sleeping.
func SetWait(l *Limiter, f func(context.Context, time.Duration) error) { l.wait = f }
